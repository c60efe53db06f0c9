// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The allocator's log in the state file: a snapshot (two slots, the valid one named in
//! the header) plus a write-ahead log of allocations, frees and exports, each with the
//! answer of the command that made it, so a restarted daemon can still give that answer.

use std::collections::BTreeMap;

use super::Origin;
use super::{resp_from, resp_words, StateFile, H_ACTIVE, LOG};
use crate::device::allocator::{Allocator, Buffer, RestoreError, GRANULE};
use crate::protocol::Resp;

/// Write-ahead log length; a full log is folded into a snapshot.
const LOG_RECORDS: usize = 4096;
const RECORD_WORDS: usize = 12;
/// The log's length in words (the snapshot slots follow it).
pub(super) const LOG_WORDS: usize = LOG_RECORDS * RECORD_WORDS;
const SNAP_HEADER: usize = 4;
const SNAP_BUFFER_WORDS: usize = 6;

/// Words the log and its snapshot slots take for at most `max_buffers` buffers.
pub(super) fn words(max_buffers: usize) -> usize {
    LOG_WORDS + 2 * (SNAP_HEADER + max_buffers * SNAP_BUFFER_WORDS)
}

/// A change to the allocator, as logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    Alloc { id: u64, offset: u64, size: u64 },
    Free { id: u64 },
    Export { id: u64, uuid: [u8; 16] },
    Unexport { id: u64 },
    Reset,
}

impl Mutation {
    /// The allocation of `b`.
    pub fn alloc(b: &Buffer) -> Mutation {
        Mutation::Alloc {
            id: b.id,
            offset: b.offset,
            size: b.size,
        }
    }
}

pub(super) struct LogCursor {
    /// Sequence number of the last change (snapshot or log record).
    pub(super) seq: u64,
    /// Next free log record.
    pub(super) next: usize,
    /// Snapshot slot to write next (1 or 2).
    pub(super) spare: u64,
    /// Answers found in the log at start-up, by nonce.
    pub(super) answers: BTreeMap<u64, Resp>,
}

impl LogCursor {
    pub(super) fn new() -> LogCursor {
        LogCursor {
            seq: 0,
            next: 0,
            spare: 1,
            answers: BTreeMap::new(),
        }
    }
}

/// Why the log cannot be read back (the device then starts empty).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("snapshot claims {0} buffers")]
    Count(usize),
    #[error("snapshot checksum mismatch")]
    Checksum,
    #[error("bad snapshot slot {0}")]
    Slot(u64),
    #[error("log record {0} is corrupt")]
    Record(usize),
    #[error(transparent)]
    Allocations(#[from] RestoreError),
}

/// What the log holds, read back at start-up.
pub(super) struct ReadBack {
    pub buffers: Vec<Buffer>,
    pub next_id: u64,
    pub seq: u64,
    pub next: usize,
    pub answers: BTreeMap<u64, Resp>,
}

impl StateFile {
    /// Snapshot plus log, checked by rebuilding the allocator.
    pub(super) fn read_allocator(&self) -> Result<ReadBack, LogError> {
        let mut bufs: BTreeMap<u64, Buffer> = BTreeMap::new();
        let mut next_id = 1;
        let mut seq = 0;
        let active = self.load(H_ACTIVE);
        if active == 1 || active == 2 {
            let base = self.slot_base(active);
            let count = self.load(base + 2) as usize;
            if count > self.max_buffers {
                return Err(LogError::Count(count));
            }
            let words: Vec<u64> = (0..SNAP_HEADER + count * SNAP_BUFFER_WORDS)
                .map(|i| self.load(base + i))
                .collect();
            if words[0] != snapshot_crc(&words[1..]) as u64 {
                return Err(LogError::Checksum);
            }
            seq = words[1];
            next_id = words[3];
            for b in words[SNAP_HEADER..].chunks(SNAP_BUFFER_WORDS) {
                let uuid = (b[3] != 0).then(|| uuid_from(b[4], b[5]));
                bufs.insert(
                    b[0],
                    Buffer {
                        id: b[0],
                        offset: b[1],
                        size: b[2],
                        uuid,
                    },
                );
            }
        } else if active != 0 {
            return Err(LogError::Slot(active));
        }
        let mut answers = BTreeMap::new();
        let mut next = 0;
        while next < LOG_RECORDS {
            let r = LOG + next * RECORD_WORDS;
            if self.load(r) != seq + 1 {
                break;
            }
            let w: Vec<u64> = (0..RECORD_WORDS).map(|i| self.load(r + i)).collect();
            match decode_mutation(&w) {
                Some(Mutation::Alloc { id, offset, size }) => {
                    bufs.insert(
                        id,
                        Buffer {
                            id,
                            offset,
                            size,
                            uuid: None,
                        },
                    );
                    next_id = next_id.max(id.saturating_add(1));
                }
                Some(Mutation::Free { id }) => {
                    bufs.remove(&id);
                }
                Some(Mutation::Export { id, uuid }) => {
                    if let Some(b) = bufs.get_mut(&id) {
                        b.uuid = Some(uuid);
                    }
                }
                Some(Mutation::Unexport { id }) => {
                    if let Some(b) = bufs.get_mut(&id) {
                        b.uuid = None;
                    }
                }
                Some(Mutation::Reset) => bufs.clear(),
                None => return Err(LogError::Record(next)),
            }
            if w[7] != 0 {
                answers.insert(w[7], resp_from(w[11], w[8], w[9], w[10]));
            }
            seq += 1;
            next += 1;
        }
        let buffers: Vec<Buffer> = bufs.into_values().collect();
        // Rebuilding checks bounds and overlaps.
        Allocator::restore(self.max_buffers as u64 * GRANULE, next_id, buffers.clone())?;
        Ok(ReadBack {
            buffers,
            next_id,
            seq,
            next,
            answers,
        })
    }

    fn slot_base(&self, slot: u64) -> usize {
        let slot_words = SNAP_HEADER + self.max_buffers * SNAP_BUFFER_WORDS;
        LOG + LOG_WORDS + (slot as usize - 1) * slot_words
    }

    /// Records a state change that has been applied to `alloc` (the caller holds the
    /// allocator's lock), with the response of the command that made it.
    pub fn record(&self, alloc: &Allocator, m: Mutation, origin: Option<Origin>, resp: &Resp) {
        let mut c = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        self.append(&mut c, m, origin, resp);
        // Under the same lock as the log, and before a fold: the answer is always in the
        // log or in the journal entry, whenever the daemon dies.
        if let Some(o) = origin {
            self.journal_answered(o, resp);
        }
        if c.next == LOG_RECORDS {
            self.fold(alloc, &mut c);
        }
    }

    /// Writes the change and its answer as the next log record (there is always room:
    /// a full log is folded at once).
    fn append(&self, c: &mut LogCursor, m: Mutation, origin: Option<Origin>, resp: &Resp) {
        c.seq += 1;
        let r = LOG + c.next * RECORD_WORDS;
        let mut w = encode_mutation(m);
        w[7] = origin.map_or(0, |o| o.nonce);
        let (s, r0, r1, r2) = resp_words(resp);
        w[8] = s;
        w[9] = r0;
        w[10] = r1;
        w[11] = r2;
        for (i, v) in w.iter().enumerate().skip(1) {
            self.store(r + i, *v);
        }
        // Valid from this store on.
        self.store(r, c.seq);
        c.next += 1;
    }

    /// Writes everything (the full log included) into the spare snapshot slot, which
    /// becomes the valid one; the log starts again.
    fn fold(&self, alloc: &Allocator, c: &mut LogCursor) {
        let base = self.slot_base(c.spare);
        let mut words = vec![0u64; SNAP_HEADER];
        words[1] = c.seq;
        let mut count = 0u64;
        for b in alloc.buffers() {
            let (u0, u1) = b.uuid.map_or((0, 0), |u| uuid_words(&u));
            words.extend_from_slice(&[b.id, b.offset, b.size, b.uuid.is_some() as u64, u0, u1]);
            count += 1;
        }
        words[2] = count;
        words[3] = alloc.next_id();
        words[0] = snapshot_crc(&words[1..]) as u64;
        for (i, w) in words.iter().enumerate() {
            self.store(base + i, *w);
        }
        self.store(H_ACTIVE, c.spare);
        c.spare = 3 - c.spare;
        c.next = 0;
    }
}

fn snapshot_crc(words: &[u64]) -> u32 {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    crc32c::crc32c(&bytes)
}

fn uuid_words(u: &[u8; 16]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&u[..8]);
    b.copy_from_slice(&u[8..]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}

fn uuid_from(a: u64, b: u64) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&a.to_le_bytes());
    u[8..].copy_from_slice(&b.to_le_bytes());
    u
}

const K_ALLOC: u64 = 1;
const K_FREE: u64 = 2;
const K_EXPORT: u64 = 3;
const K_UNEXPORT: u64 = 4;
const K_RESET: u64 = 5;

/// Record words: seq, kind, id, offset, size, uuid0, uuid1, nonce, resp (4 words: status,
/// result0, result1, tag).
fn encode_mutation(m: Mutation) -> [u64; RECORD_WORDS] {
    let mut w = [0u64; RECORD_WORDS];
    match m {
        Mutation::Alloc { id, offset, size } => {
            w[1] = K_ALLOC;
            w[2] = id;
            w[3] = offset;
            w[4] = size;
        }
        Mutation::Free { id } => {
            w[1] = K_FREE;
            w[2] = id;
        }
        Mutation::Export { id, uuid } => {
            w[1] = K_EXPORT;
            w[2] = id;
            (w[5], w[6]) = uuid_words(&uuid);
        }
        Mutation::Unexport { id } => {
            w[1] = K_UNEXPORT;
            w[2] = id;
        }
        Mutation::Reset => w[1] = K_RESET,
    }
    w
}

fn decode_mutation(w: &[u64]) -> Option<Mutation> {
    Some(match w[1] {
        K_ALLOC => Mutation::Alloc {
            id: w[2],
            offset: w[3],
            size: w[4],
        },
        K_FREE => Mutation::Free { id: w[2] },
        K_EXPORT => Mutation::Export {
            id: w[2],
            uuid: uuid_from(w[5], w[6]),
        },
        K_UNEXPORT => Mutation::Unexport { id: w[2] },
        K_RESET => Mutation::Reset,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::devmem::FileId;
    use crate::device::state::tests::ok;
    use std::path::PathBuf;
    use std::sync::atomic::Ordering;

    const SIZE: u64 = 64 << 20;

    fn temp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("cxl-state-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    fn id() -> FileId {
        FileId { dev: 7, ino: 42 }
    }

    #[test]
    fn allocations_survive_reopening_across_log_compactions() {
        let path = temp("wal");
        let (s, r) = StateFile::open(&path, id(), SIZE, false).unwrap();
        assert!(r.buffers.is_empty());
        let mut a = Allocator::new(SIZE);
        // Enough changes to fold the log into a snapshot twice.
        for round in 0..3 * LOG_RECORDS / 2 {
            let b = a.alloc(4096, 0).unwrap();
            let m = Mutation::alloc(&b);
            s.record(&a, m, None, &ok(b.id));
            if round % 3 == 0 {
                a.free(b.id).unwrap();
                s.record(&a, Mutation::Free { id: b.id }, None, &ok(0));
            }
        }
        let exported = a.buffers().next().unwrap().id;
        a.set_uuid(exported, [3; 16]).unwrap();
        s.record(
            &a,
            Mutation::Export {
                id: exported,
                uuid: [3; 16],
            },
            None,
            &ok(0),
        );
        s.counter(2).store(12345, Ordering::Relaxed);
        drop(s);
        let (s, r) = StateFile::open(&path, id(), SIZE, false).unwrap();
        let want: Vec<Buffer> = a.buffers().cloned().collect();
        assert_eq!(r.buffers, want);
        assert_eq!(r.next_id, a.next_id());
        assert_eq!(s.counter(2).load(Ordering::Relaxed), 12345);
        // Another memory file (or size) starts empty.
        drop(s);
        let other = FileId { dev: 7, ino: 43 };
        let (s, r) = StateFile::open(&path, other, SIZE, false).unwrap();
        assert!(r.buffers.is_empty());
        assert_eq!(s.counter(2).load(Ordering::Relaxed), 0);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn the_change_that_fills_the_log_keeps_its_answer_until_the_fold() {
        let path = temp("fill");
        let (s, _) = StateFile::open(&path, id(), SIZE, false).unwrap();
        let mut a = Allocator::new(SIZE);
        for _ in 0..LOG_RECORDS - 1 {
            let b = a.alloc(4096, 0).unwrap();
            s.record(&a, Mutation::alloc(&b), None, &ok(b.id));
        }
        // The last free record, and the daemon dies before the journal and the fold.
        let last = a.alloc(4096, 0).unwrap();
        let origin = Origin {
            queue: 0,
            head: 3,
            nonce: 77,
        };
        let mut c = s.cursor.lock().unwrap();
        s.append(&mut c, Mutation::alloc(&last), Some(origin), &ok(last.id));
        drop(c);
        drop(s);
        let (s, r) = StateFile::open(&path, id(), SIZE, false).unwrap();
        assert_eq!(r.buffers.len(), LOG_RECORDS);
        assert!(r.buffers.contains(&last));
        assert_eq!(s.logged_answers().get(&77), Some(&ok(last.id)));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_torn_log_record_is_not_replayed() {
        let path = temp("torn");
        let (s, _) = StateFile::open(&path, id(), SIZE, false).unwrap();
        let mut a = Allocator::new(SIZE);
        let b = a.alloc(8192, 0).unwrap();
        let m = Mutation::alloc(&b);
        s.record(&a, m, None, &ok(b.id));
        // A second record whose fields were written but not its sequence number.
        let r = LOG + RECORD_WORDS;
        let w = encode_mutation(Mutation::Free { id: b.id });
        for (i, v) in w.iter().enumerate().skip(1) {
            s.store(r + i, *v);
        }
        drop(s);
        let (_, r) = StateFile::open(&path, id(), SIZE, false).unwrap();
        assert_eq!(r.buffers, vec![b]);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_corrupt_snapshot_starts_empty_but_keeps_counters() {
        let path = temp("corrupt");
        let (s, _) = StateFile::open(&path, id(), SIZE, false).unwrap();
        s.store(H_ACTIVE, 1);
        s.store(s.slot_base(1) + 2, 1);
        s.counter(0).store(77, Ordering::Relaxed);
        drop(s);
        let (s, r) = StateFile::open(&path, id(), SIZE, false).unwrap();
        assert!(r.buffers.is_empty());
        assert!(r.note.contains("unreadable"), "{}", r.note);
        assert_eq!(s.counter(0).load(Ordering::Relaxed), 77);
        let _ = std::fs::remove_file(&path);
    }
}
