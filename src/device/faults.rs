// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Fault injection: what a driver developer tests the error paths of a driver with.
//!
//! Every fault is deterministic. A rule matches commands by opcode (or all of them) and fires
//! on the Nth match, on every Kth, or with a probability drawn from the rule's own seeded
//! generator. Rules are looked at in the order the device takes commands from the ring, so
//! the same guest program meets the same faults on every run. Besides per-command rules the
//! device can stall its engines, model a slower device (latency and bandwidth), and carry
//! poisoned ranges of device memory (media errors).

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::protocol::Status;

/// When a rule fires, counted over the commands it matches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    /// The Nth matching command (1-based), once.
    Nth(u64),
    /// Every Kth matching command.
    Every(u64),
    /// Each matching command with this probability, in percent (0-100).
    Percent(f64),
}

/// What happens to a command a rule fires on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    /// Not executed; completes with this status.
    Fail(Status),
    /// Executed; its completion is delayed by a time from `min` to `max` (drawn from the
    /// rule's generator).
    Delay { min: Duration, max: Duration },
    /// Executed but never completed, until the queue stops (then INTERRUPTED).
    Hang,
    /// Executed and completed after `after`: typically once the driver has given up on it.
    Late { after: Duration },
    /// Completed with a used length shorter than a response.
    CorruptLength,
    /// Completed with a status value the specification does not define.
    CorruptStatus,
    /// Not executed, yet completed with OK and, for COPY, COPY_PAGES and FILL, the count a
    /// complete command reports: a device that claims work it did not do.
    Skip,
}

/// A status value no version of the specification defines.
pub const UNDEFINED_STATUS: u32 = 0xdead;

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub id: u64,
    /// Opcode to match; None matches every command.
    pub opcode: Option<u16>,
    pub trigger: Trigger,
    pub action: Action,
    pub seed: u64,
    /// Commands the rule matched so far.
    pub matched: u64,
    /// Times it fired.
    pub fired: u64,
    rng: u64,
}

/// How the rule set is changed (what the control channel's requests become).
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSpec {
    pub opcode: Option<u16>,
    pub trigger: Trigger,
    pub action: Action,
    pub seed: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FaultError {
    #[error("the Nth or every-Kth count must be at least 1")]
    ZeroCount,
    #[error("a percentage must be from 0 to 100, not {0}")]
    Percent(f64),
    #[error("a delay's minimum ({0:?}) exceeds its maximum ({1:?})")]
    DelayRange(Duration, Duration),
    #[error("the status OK is not a fault")]
    OkStatus,
    #[error("no fault rule {0}")]
    NoRule(u64),
    #[error("a poisoned range must be non-empty and inside device memory ({size} bytes): {offset:#x} + {len:#x}")]
    PoisonRange { offset: u64, len: u64, size: u64 },
    #[error("too many fault rules (at most {0})")]
    TooMany(usize),
}

/// At most this many rules (and poisoned ranges): the control channel is trusted, but a
/// script in a loop should meet an error, not exhaust the daemon.
pub const MAX_RULES: usize = 256;

/// The device's latency and bandwidth model: each command's completion takes at least this
/// long on the engine that runs it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Model {
    pub enforce: bool,
    pub read_latency_ns: u32,
    pub write_latency_ns: u32,
    /// MB/s; 0 means unlimited.
    pub read_bandwidth_mbs: u32,
    pub write_bandwidth_mbs: u32,
}

impl Model {
    /// How long an engine spends on a command that reads `read` and writes `written` bytes.
    pub fn cost(&self, read: u64, written: u64) -> Duration {
        if !self.enforce {
            return Duration::ZERO;
        }
        let per = |bytes: u64, mbs: u32| {
            if mbs == 0 || bytes == 0 {
                0
            } else {
                // bytes / (MB/s) in nanoseconds: bytes * 1000 / mbs.
                bytes.saturating_mul(1000) / mbs as u64
            }
        };
        let mut ns = 0u64;
        if read > 0 {
            ns += self.read_latency_ns as u64 + per(read, self.read_bandwidth_mbs);
        }
        if written > 0 {
            ns += self.write_latency_ns as u64 + per(written, self.write_bandwidth_mbs);
        }
        if read == 0 && written == 0 {
            ns = self.read_latency_ns.min(self.write_latency_ns) as u64;
        }
        Duration::from_nanos(ns)
    }
}

/// All fault state of one device.
#[derive(Default)]
pub struct Faults {
    rules: Mutex<Rules>,
    stall: Mutex<bool>,
    unstalled: Condvar,
    model: Mutex<Model>,
    poison: Mutex<Vec<(u64, u64)>>,
}

#[derive(Default)]
struct Rules {
    next_id: u64,
    list: Vec<Rule>,
}

/// xorshift64*: one generator per rule, so rules do not disturb each other's sequences.
fn next(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

impl Rule {
    fn fires(&mut self) -> bool {
        self.matched += 1;
        let fire = match self.trigger {
            Trigger::Nth(n) => self.matched == n,
            Trigger::Every(k) => self.matched.is_multiple_of(k),
            Trigger::Percent(p) => (next(&mut self.rng) % 1_000_000) as f64 / 10_000.0 < p,
        };
        self.fired += fire as u64;
        fire
    }

    /// The action as it applies to this firing (a delay drawn from its range).
    fn instance(&mut self) -> Action {
        match self.action {
            Action::Delay { min, max } if max > min => {
                let span = (max - min).as_micros() as u64 + 1;
                let d = min + Duration::from_micros(next(&mut self.rng) % span);
                Action::Delay { min: d, max: d }
            }
            a => a,
        }
    }
}

impl Faults {
    pub fn new() -> Faults {
        Faults::default()
    }

    pub fn add(&self, spec: RuleSpec) -> Result<u64, FaultError> {
        match spec.trigger {
            Trigger::Nth(0) | Trigger::Every(0) => return Err(FaultError::ZeroCount),
            Trigger::Percent(p) if !(0.0..=100.0).contains(&p) => {
                return Err(FaultError::Percent(p))
            }
            _ => {}
        }
        match spec.action {
            Action::Delay { min, max } if min > max => {
                return Err(FaultError::DelayRange(min, max))
            }
            Action::Fail(Status::Ok) => return Err(FaultError::OkStatus),
            _ => {}
        }
        let mut r = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        if r.list.len() >= MAX_RULES {
            return Err(FaultError::TooMany(MAX_RULES));
        }
        r.next_id += 1;
        let id = r.next_id;
        r.list.push(Rule {
            id,
            opcode: spec.opcode,
            trigger: spec.trigger,
            action: spec.action,
            seed: spec.seed,
            matched: 0,
            fired: 0,
            // A zero state would stay zero.
            rng: spec.seed ^ 0x9e37_79b9_7f4a_7c15,
        });
        Ok(id)
    }

    /// Removes one rule, or all with None; returns how many went.
    pub fn clear(&self, id: Option<u64>) -> Result<usize, FaultError> {
        let mut r = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let before = r.list.len();
        match id {
            Some(id) => {
                r.list.retain(|x| x.id != id);
                if r.list.len() == before {
                    return Err(FaultError::NoRule(id));
                }
            }
            None => r.list.clear(),
        }
        Ok(before - r.list.len())
    }

    pub fn rules(&self) -> Vec<Rule> {
        self.rules
            .lock()
            .map(|r| r.list.clone())
            .unwrap_or_default()
    }

    /// The fault for the next command taken from the ring, if any. Every matching rule
    /// counts the command; the first that fires decides.
    pub fn decide(&self, opcode: u16) -> Option<Action> {
        let mut r = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let mut chosen = None;
        for rule in r.list.iter_mut() {
            if rule.opcode.is_some_and(|o| o != opcode) {
                continue;
            }
            if rule.fires() && chosen.is_none() {
                chosen = Some(rule.instance());
            }
        }
        chosen
    }

    /// Stops (true) or restarts the engines.
    pub fn set_stalled(&self, on: bool) {
        let mut s = self.stall.lock().unwrap_or_else(|e| e.into_inner());
        *s = on;
        self.unstalled.notify_all();
    }

    pub fn stalled(&self) -> bool {
        *self.stall.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by an engine before it runs a command: waits while the engines are stalled,
    /// looking at `cancelled` every 10 ms (a queue stop must not wait for an unstall).
    /// Returns false when it gave up because of `cancelled`.
    pub fn wait_unstalled(&self, cancelled: &dyn Fn() -> bool) -> bool {
        let mut s = self.stall.lock().unwrap_or_else(|e| e.into_inner());
        while *s {
            if cancelled() {
                return false;
            }
            s = self
                .unstalled
                .wait_timeout(s, Duration::from_millis(10))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    pub fn model(&self) -> Model {
        *self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_model(&self, m: Model) {
        *self.model.lock().unwrap_or_else(|e| e.into_inner()) = m;
    }

    /// Marks [offset, offset + len) of device memory (of `size` bytes) poisoned.
    pub fn poison(&self, offset: u64, len: u64, size: u64) -> Result<(), FaultError> {
        let bad = || FaultError::PoisonRange { offset, len, size };
        let end = offset.checked_add(len).ok_or_else(bad)?;
        if len == 0 || end > size {
            return Err(bad());
        }
        let mut p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() >= MAX_RULES {
            return Err(FaultError::TooMany(MAX_RULES));
        }
        p.push((offset, end));
        normalize(&mut p);
        Ok(())
    }

    /// Clears [offset, offset + len); returns whether anything was poisoned there.
    pub fn unpoison(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        let mut p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let mut hit = false;
        for &(s, e) in p.iter() {
            if e <= offset || s >= end {
                out.push((s, e));
                continue;
            }
            hit = true;
            if s < offset {
                out.push((s, offset));
            }
            if e > end {
                out.push((end, e));
            }
        }
        *p = out;
        hit
    }

    /// Poisoned ranges as (offset, length), in order.
    pub fn poisoned(&self) -> Vec<(u64, u64)> {
        self.poison
            .lock()
            .map(|p| p.iter().map(|&(s, e)| (s, e - s)).collect())
            .unwrap_or_default()
    }

    /// Where the poison overlapping [offset, offset + len) ends, if there is any.
    pub fn poisoned_end(&self, offset: u64, len: u64) -> Option<u64> {
        self.poison_within(offset, len).last().map(|&(_, e)| e)
    }

    /// The first poisoned byte in [offset, offset + len) of device memory, if any.
    pub fn first_poisoned(&self, offset: u64, len: u64) -> Option<u64> {
        self.poison_within(offset, len)
            .first()
            .map(|&(s, _)| s.max(offset))
    }

    /// The poisoned ranges overlapping [offset, offset + len), in order (the list is kept
    /// sorted and merged).
    fn poison_within(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let end = offset.saturating_add(len);
        let p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        p.iter()
            .copied()
            .filter(|&(s, e)| s < end && e > offset)
            .collect()
    }
}

/// Sorts and merges overlapping or touching ranges.
fn normalize(p: &mut Vec<(u64, u64)>) {
    p.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(p.len());
    for &(s, e) in p.iter() {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    *p = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(opcode: Option<u16>, trigger: Trigger, action: Action) -> RuleSpec {
        RuleSpec {
            opcode,
            trigger,
            action,
            seed: 7,
        }
    }

    #[test]
    fn nth_every_and_opcode_scope() {
        let f = Faults::new();
        f.add(spec(
            Some(0x10),
            Trigger::Nth(3),
            Action::Fail(Status::BadGpa),
        ))
        .unwrap();
        f.add(spec(None, Trigger::Every(4), Action::Hang)).unwrap();
        let seen: Vec<Option<Action>> = (0..8).map(|_| f.decide(0x10)).collect();
        assert_eq!(seen[2], Some(Action::Fail(Status::BadGpa)));
        assert_eq!(seen[3], Some(Action::Hang));
        assert_eq!(seen[7], Some(Action::Hang));
        assert_eq!(seen.iter().filter(|a| a.is_some()).count(), 3);
        // Another opcode is counted by the catch-all rule only.
        assert_eq!(f.decide(0x11), None);
        let rules = f.rules();
        assert_eq!((rules[0].matched, rules[0].fired), (8, 1));
        assert_eq!((rules[1].matched, rules[1].fired), (9, 2));
    }

    #[test]
    fn percent_is_reproducible_and_about_right() {
        let run = || {
            let f = Faults::new();
            f.add(spec(None, Trigger::Percent(25.0), Action::CorruptStatus))
                .unwrap();
            (0..10_000)
                .map(|_| f.decide(0).is_some())
                .collect::<Vec<bool>>()
        };
        let a = run();
        assert_eq!(a, run(), "same seed, same faults");
        let n = a.iter().filter(|&&x| x).count();
        assert!((2200..2800).contains(&n), "{n} of 10000 at 25%");
    }

    #[test]
    fn delays_are_drawn_from_their_range() {
        let f = Faults::new();
        let (min, max) = (Duration::from_millis(1), Duration::from_millis(5));
        f.add(spec(None, Trigger::Every(1), Action::Delay { min, max }))
            .unwrap();
        for _ in 0..100 {
            let Some(Action::Delay { min: d, max: e }) = f.decide(0) else {
                panic!("no delay")
            };
            assert_eq!(d, e);
            assert!(d >= min && d <= max);
        }
    }

    #[test]
    fn bad_rules_are_refused() {
        let f = Faults::new();
        let add = |t, a| f.add(spec(None, t, a));
        assert_eq!(
            add(Trigger::Nth(0), Action::Hang),
            Err(FaultError::ZeroCount)
        );
        assert_eq!(
            add(Trigger::Percent(101.0), Action::Hang),
            Err(FaultError::Percent(101.0))
        );
        assert_eq!(
            add(Trigger::Nth(1), Action::Fail(Status::Ok)),
            Err(FaultError::OkStatus)
        );
        assert!(add(
            Trigger::Nth(1),
            Action::Delay {
                min: Duration::from_secs(2),
                max: Duration::from_secs(1)
            }
        )
        .is_err());
        assert_eq!(f.clear(Some(9)), Err(FaultError::NoRule(9)));
        for _ in 0..MAX_RULES {
            add(Trigger::Nth(1), Action::Hang).unwrap();
        }
        assert_eq!(
            add(Trigger::Nth(1), Action::Hang),
            Err(FaultError::TooMany(MAX_RULES))
        );
        assert_eq!(f.clear(None), Ok(MAX_RULES));
    }

    #[test]
    fn poison_ranges_merge_split_and_answer() {
        let f = Faults::new();
        let size = 1 << 20;
        f.poison(0x1000, 0x1000, size).unwrap();
        f.poison(0x1800, 0x1000, size).unwrap();
        f.poison(0x8000, 0x10, size).unwrap();
        assert_eq!(f.poisoned(), vec![(0x1000, 0x1800), (0x8000, 0x10)]);
        assert_eq!(f.first_poisoned(0, 0x1000), None);
        assert_eq!(f.first_poisoned(0, 0x1001), Some(0x1000));
        assert_eq!(f.first_poisoned(0x2000, 0x100), Some(0x2000));
        assert_eq!(f.poisoned_end(0, 0x1000), None);
        assert_eq!(f.poisoned_end(0x2000, 0x7000), Some(0x8010));
        assert_eq!(f.poisoned_end(0x2000, 0x100), Some(0x2800));
        assert!(f.unpoison(0x1400, 0x100));
        assert_eq!(
            f.poisoned(),
            vec![(0x1000, 0x400), (0x1500, 0x1300), (0x8000, 0x10)]
        );
        assert!(!f.unpoison(0x9000, 0x1000));
        assert!(f.poison(size - 1, 2, size).is_err());
        assert!(f.poison(0, 0, size).is_err());
        assert!(f.poison(u64::MAX, 2, size).is_err());
    }

    #[test]
    fn a_stall_holds_engines_until_unstalled_or_cancelled() {
        let f = std::sync::Arc::new(Faults::new());
        f.set_stalled(true);
        assert!(!f.wait_unstalled(&|| true), "cancel ends the wait");
        let g = f.clone();
        let t = std::thread::spawn(move || g.wait_unstalled(&|| false));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!t.is_finished());
        f.set_stalled(false);
        assert!(t.join().unwrap());
    }

    #[test]
    fn the_model_charges_latency_and_bandwidth() {
        let m = Model {
            enforce: true,
            read_latency_ns: 1000,
            write_latency_ns: 2000,
            read_bandwidth_mbs: 1000,
            write_bandwidth_mbs: 500,
        };
        // 1 MB at 1000 MB/s is 1 ms; at 500 MB/s 2 ms.
        assert_eq!(
            m.cost(1_000_000, 1_000_000),
            Duration::from_nanos(1000 + 1_000_000 + 2000 + 2_000_000)
        );
        assert_eq!(m.cost(0, 0), Duration::from_nanos(1000));
        assert_eq!(Model::default().cost(1 << 30, 1 << 30), Duration::ZERO);
    }
}
