// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The ring journal, in the state file: where each ring stood and which requests were
//! taken from the command queue but not yet returned, with what is known of their
//! outcome. A daemon that replaces a dead one reads it to carry on (see `crate::ring::resume`).

use std::sync::atomic::Ordering;

pub use crate::device::state::journal_region::capacity;
use crate::device::state::journal_region::{
    entry, ANSWERED, COMPLETING, E_NONCE, E_PACKED, E_RESP, E_RESP_GPA, E_STATE, E_TAG, FREE,
    RUNNING,
};
pub use crate::device::state::journal_region::{MAX_EXTRA_QUEUE, MAX_QUEUE};
pub use crate::device::state::Origin;
use crate::device::state::{resp_from, StateFile, H_NONCE, JOURNAL};
use crate::protocol::{Resp, Status};

// Layout, in 8-byte words from the journal's start (its size and the entries' layout are
// the state file's, `journal_region`): a block of words per ring, then an entry per
// descriptor head of command queue 0, then MAX_EXTRA_QUEUE entries for each further
// command queue.
const QUEUE_WORDS: usize = 16;
const QUEUES: usize = 0;
const Q_VALID: usize = 0;
const Q_NEXT_AVAIL: usize = 1;
const Q_DESC: usize = 2;
const Q_AVAIL: usize = 3;
const Q_USED: usize = 4;
const Q_SIZE: usize = 5;

/// Ring addresses a journal belongs to: a restored journal is used only for the same ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingId {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub size: u16,
}

/// A request that was taken from the command queue and not returned when the previous
/// daemon died.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    pub head: u16,
    pub tag: u64,
    pub resp_gpa: u64,
    pub resp_len: u32,
    pub outcome: Outcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing is known: answer INTERRUPTED.
    Unknown,
    /// The command took effect with this response.
    Answered(Resp),
    /// The response is in guest memory (this many bytes); publish it unless already done.
    Completing { used_slot: u16, written: u32 },
}

/// The journal part of a state file.
#[derive(Clone, Copy)]
pub struct Journal<'a> {
    file: &'a StateFile,
}

impl<'a> Journal<'a> {
    /// The journal of a state file.
    pub fn of(file: &'a StateFile) -> Journal<'a> {
        Journal { file }
    }
}

impl Journal<'_> {
    fn load(&self, i: usize) -> u64 {
        self.file.load(i)
    }

    fn store(&self, i: usize, v: u64) {
        self.file.store(i, v)
    }

    fn queue_word(q: usize, w: usize) -> usize {
        JOURNAL + QUEUES + q * QUEUE_WORDS + w
    }

    /// A fresh nonce for a request taken from the ring (unique across restarts).
    pub fn next_nonce(&self) -> u64 {
        self.file.word(H_NONCE).fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The ring `q` the journal describes now (from the front-end's set-up).
    pub fn set_ring(&self, q: usize, ring: RingId, next_avail: u16) {
        self.store(Self::queue_word(q, Q_VALID), 0);
        self.store(Self::queue_word(q, Q_DESC), ring.desc);
        self.store(Self::queue_word(q, Q_AVAIL), ring.avail);
        self.store(Self::queue_word(q, Q_USED), ring.used);
        self.store(Self::queue_word(q, Q_SIZE), ring.size as u64);
        self.store(Self::queue_word(q, Q_NEXT_AVAIL), next_avail as u64);
        self.store(Self::queue_word(q, Q_VALID), 1);
    }

    /// Where the previous daemon stopped taking requests from ring `q`, if it is this ring.
    pub fn ring_position(&self, q: usize, ring: RingId) -> Option<u16> {
        if self.load(Self::queue_word(q, Q_VALID)) != 1 {
            return None;
        }
        let same = self.load(Self::queue_word(q, Q_DESC)) == ring.desc
            && self.load(Self::queue_word(q, Q_AVAIL)) == ring.avail
            && self.load(Self::queue_word(q, Q_USED)) == ring.used
            && self.load(Self::queue_word(q, Q_SIZE)) == ring.size as u64;
        same.then(|| self.load(Self::queue_word(q, Q_NEXT_AVAIL)) as u16)
    }

    /// A request is taken from avail position `pos`. Recorded before the position moves on.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &self,
        q: usize,
        head: u16,
        size: u16,
        pos: u16,
        nonce: u64,
        tag: u64,
        resp: (u64, u32),
    ) {
        // A head outside the ring is answered by nobody (add_used refuses it); only the
        // position moves on.
        if head < size && (head as usize) < capacity(q) {
            self.store(entry(q, head, E_NONCE), nonce);
            self.store(entry(q, head, E_TAG), tag);
            self.store(entry(q, head, E_RESP_GPA), resp.0);
            self.store(entry(q, head, E_PACKED), resp.1 as u64 | (pos as u64) << 32);
            self.store(entry(q, head, E_STATE), RUNNING);
        }
        self.store(
            Self::queue_word(q, Q_NEXT_AVAIL),
            pos.wrapping_add(1) as u64,
        );
    }

    /// The response (`written` bytes) is in guest memory; the used entry goes to `used_slot`.
    pub fn completing(&self, q: usize, head: u16, used_slot: u16, written: u32) {
        if head as usize >= capacity(q) {
            return;
        }
        let packed = self.load(entry(q, head, E_PACKED)) & 0x0000_ffff_ffff_ffff;
        self.store(entry(q, head, E_PACKED), packed | (used_slot as u64) << 48);
        self.store(entry(q, head, E_RESP), written as u64);
        self.store(entry(q, head, E_STATE), COMPLETING);
    }

    /// The request is back with the driver.
    pub fn release(&self, q: usize, head: u16) {
        if (head as usize) < capacity(q) {
            self.store(entry(q, head, E_STATE), FREE);
        }
    }

    /// The front-end stopped ring `q`: nothing in it is ours to answer any more.
    pub fn clear_ring(&self, q: usize) {
        self.store(Self::queue_word(q, Q_VALID), 0);
        // Rings may have any size up to the maximum; only entries in use are written.
        for head in 0..capacity(q) {
            if self.load(entry(q, head as u16, E_STATE)) != FREE {
                self.release(q, head as u16);
            }
        }
    }

    /// Requests the previous daemon took from ring `q` (taken before avail position
    /// `next_avail`) and did not return.
    pub fn pending(&self, q: usize, size: u16, next_avail: u16) -> Vec<Pending> {
        let answers = self.file.logged_answers();
        let mut out = Vec::new();
        let e = |head, w| entry(q, head, w);
        for head in 0..(size as usize).min(capacity(q)) {
            let head = head as u16;
            let state = self.load(e(head, E_STATE));
            if state == FREE {
                continue;
            }
            let packed = self.load(e(head, E_PACKED));
            let pos = (packed >> 32) as u16;
            // Recorded but the position never moved past it: it is still in the ring
            // and will be taken again. Anything else was taken, however long ago (a
            // request may outlive tens of thousands of others on its queue).
            if pos.wrapping_sub(next_avail) < size.max(1) {
                self.release(q, head);
                continue;
            }
            let nonce = self.load(e(head, E_NONCE));
            let outcome = match state {
                ANSWERED => Outcome::Answered(resp_from(
                    self.load(e(head, E_TAG)),
                    self.load(e(head, E_RESP)),
                    self.load(e(head, E_RESP + 1)),
                    self.load(e(head, E_RESP + 2)),
                )),
                COMPLETING => Outcome::Completing {
                    used_slot: (packed >> 48) as u16,
                    written: self.load(e(head, E_RESP)) as u32,
                },
                _ => match answers.get(&nonce) {
                    Some(r) => Outcome::Answered(*r),
                    None => Outcome::Unknown,
                },
            };
            out.push(Pending {
                head,
                tag: self.load(e(head, E_TAG)),
                resp_gpa: self.load(e(head, E_RESP_GPA)),
                resp_len: packed as u32,
                outcome,
            });
        }
        out
    }
}

/// The response for a request whose outcome is unknown.
pub fn interrupted(tag: u64) -> Resp {
    Resp {
        tag,
        status: Status::Interrupted as u32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::allocator::Allocator;
    use crate::device::state::tests::ok;
    use crate::device::state::Mutation;
    use std::collections::BTreeMap;

    const SIZE: u64 = 64 << 20;
    /// A ring of 8 entries.
    const RING: RingId = RingId {
        desc: 0x1000,
        avail: 0x2000,
        used: 0x3000,
        size: 8,
    };

    #[test]
    fn the_journal_tells_what_each_request_in_flight_needs() {
        let file = StateFile::anonymous(SIZE).unwrap();
        let s = Journal::of(&file);
        let ring = RING;
        s.set_ring(0, ring, 10);
        let mut a = Allocator::new(SIZE);
        // Head 1: running, unknown outcome. Head 2: an allocation that took effect.
        // Head 3: being published. Head 4: journaled but the position never moved past
        // it (still in the ring). Head 5: answered through the log only.
        s.begin(0, 1, 8, 10, 101, 1, (0x9000, 32));
        s.begin(0, 2, 8, 11, 102, 2, (0x9100, 32));
        let b = a.alloc(4096, 0).unwrap();
        let m = Mutation::alloc(&b);
        file.record(
            &a,
            m,
            Some(Origin {
                queue: 0,
                head: 2,
                nonce: 102,
            }),
            &ok(b.id),
        );
        s.begin(0, 3, 8, 12, 103, 3, (0x9200, 32));
        s.completing(0, 3, 5, 32);
        s.begin(0, 5, 8, 13, 105, 5, (0x9300, 32));
        s.begin(0, 4, 8, 14, 104, 4, (0x9400, 32));
        s.store(Journal::queue_word(0, Q_NEXT_AVAIL), 14);
        file.note_logged_answer(105, ok(55));
        // A head beyond the ring is never journaled.
        s.begin(0, 9, 8, 14, 109, 9, (0x9500, 32));
        assert_eq!(s.ring_position(0, ring), Some(15));
        s.store(Journal::queue_word(0, Q_NEXT_AVAIL), 14);
        assert_eq!(s.ring_position(0, RingId { size: 16, ..ring }), None);
        let p = s.pending(0, 8, 14);
        let by_head: BTreeMap<u16, Outcome> = p.iter().map(|p| (p.head, p.outcome)).collect();
        assert_eq!(by_head.len(), 4, "{p:?}");
        assert_eq!(by_head[&1], Outcome::Unknown);
        assert_eq!(by_head[&2], Outcome::Answered(Resp { tag: 2, ..ok(b.id) }));
        assert_eq!(
            by_head[&3],
            Outcome::Completing {
                used_slot: 5,
                written: 32
            }
        );
        assert_eq!(by_head[&5], Outcome::Answered(ok(55)));
        assert_eq!(p.iter().find(|p| p.head == 1).unwrap().tag, 1);
        // Released entries are gone; a stopped ring forgets everything.
        s.release(0, 1);
        assert_eq!(s.pending(0, 8, 14).len(), 3);
        s.clear_ring(0);
        assert!(s.pending(0, 8, 14).is_empty());
        assert_eq!(s.ring_position(0, ring), None);
    }

    #[test]
    fn a_request_outliving_many_others_is_still_in_flight() {
        let file = StateFile::anonymous(SIZE).unwrap();
        let s = Journal::of(&file);
        let ring = RING;
        s.set_ring(0, ring, 0);
        // Taken at position 3; 40,000 requests later (the index wrapped past half its
        // range) it is still running.
        s.begin(0, 2, 8, 3, 7, 42, (0x9000, 32));
        let now = 3u16.wrapping_add(40_000);
        s.store(Journal::queue_word(0, Q_NEXT_AVAIL), now as u64);
        let p = s.pending(0, 8, now);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            (p[0].head, p[0].tag, p[0].outcome),
            (2, 42, Outcome::Unknown)
        );
    }

    #[test]
    fn each_command_queue_has_entries_of_its_own() {
        let file = StateFile::anonymous(SIZE).unwrap();
        let s = Journal::of(&file);
        let ring = |base: u64| RingId {
            desc: base,
            avail: base + 0x1000,
            used: base + 0x2000,
            size: 8,
        };
        // Command queues 0, 1 and 2 are virtqueues 0, 2 and 3; the same head in each.
        for (q, base) in [(0, 0x10000), (2, 0x20000), (3, 0x30000)] {
            s.set_ring(q, ring(base), 0);
            s.begin(q, 4, 8, 0, 100 + q as u64, q as u64, (0x9000, 32));
        }
        s.completing(2, 4, 0, 32);
        assert_eq!(s.pending(0, 8, 1)[0].outcome, Outcome::Unknown);
        assert_eq!(s.pending(3, 8, 1)[0].tag, 3);
        assert!(matches!(
            s.pending(2, 8, 1)[0].outcome,
            Outcome::Completing { written: 32, .. }
        ));
        // Stopping one ring leaves the others' requests alone.
        s.clear_ring(2);
        assert!(s.pending(2, 8, 1).is_empty());
        assert_eq!(s.pending(0, 8, 1).len(), 1);
        assert_eq!(s.pending(3, 8, 1).len(), 1);
        // The event queue has no entries; extra command queues hold 1024 heads.
        assert_eq!(capacity(1), 0);
        assert_eq!(capacity(2), MAX_EXTRA_QUEUE);
        s.begin(2, MAX_EXTRA_QUEUE as u16, 2048, 1, 1, 1, (0, 32));
        assert!(s.pending(2, 2048, 2).is_empty());
    }
}
