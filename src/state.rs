// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Crash-safe device state: a small file next to the memory file, mapped shared, so that a
//! daemon killed at any instruction leaves a consistent record for the one that replaces it.
//!
//! It holds the device counters, the allocator (a snapshot plus a write-ahead log of
//! allocations, frees and exports) and the command queue's journal: where the queue stood
//! and which requests were taken but not yet returned. Every multi-word record is written
//! first and made valid by one 8-byte store last, so a torn record is never read. The
//! kernel's page cache keeps the stores when the process dies; surviving a host crash is
//! out of scope (nothing is fsynced on the command path).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vm_memory::{FileOffset, MmapRegion, VolatileMemory};

use crate::allocator::{Allocator, Buffer, GRANULE};
use crate::crc32c::crc32c;
use crate::devmem::FileId;
use crate::files;
use crate::protocol::{Resp, Status, STAT_COUNT};

const MAGIC: u64 = u64::from_le_bytes(*b"CXLASTA1");
const VERSION: u64 = 1;
/// Largest queue the journal can describe (the virtio maximum).
pub const MAX_QUEUE: usize = 32768;
/// Write-ahead log length; a full log is folded into a snapshot.
const LOG_RECORDS: usize = 4096;

// Layout, in 8-byte words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_DEV: usize = 2;
const H_INO: usize = 3;
const H_SIZE: usize = 4;
const H_PID: usize = 5;
/// 0: no snapshot, 1 or 2: the valid snapshot slot.
const H_ACTIVE: usize = 6;
const H_NONCE: usize = 7;
const COUNTERS: usize = 64;
const QUEUE_WORDS: usize = 16;
const QUEUES: usize = 128;
const Q_VALID: usize = 0;
const Q_NEXT_AVAIL: usize = 1;
const Q_DESC: usize = 2;
const Q_AVAIL: usize = 3;
const Q_USED: usize = 4;
const Q_SIZE: usize = 5;
const INFLIGHT: usize = 512;
const ENTRY_WORDS: usize = 8;
const E_STATE: usize = 0;
const E_NONCE: usize = 1;
const E_TAG: usize = 2;
const E_RESP_GPA: usize = 3;
/// resp_len (32 bits) | avail position << 32 | used slot << 48
const E_PACKED: usize = 4;
/// ANSWERED: status | detail << 32, result0, result1. COMPLETING: bytes written.
const E_RESP: usize = 5;
const LOG: usize = INFLIGHT + MAX_QUEUE * ENTRY_WORDS;
const RECORD_WORDS: usize = 12;
const SNAP_HEADER: usize = 4;
const SNAP_BUFFER_WORDS: usize = 6;

/// Journal entry states.
const FREE: u64 = 0;
/// Taken from the ring; outcome unknown.
const RUNNING: u64 = 1;
/// A state-changing command took effect; its response is recorded.
const ANSWERED: u64 = 2;
/// The response is in guest memory; the used-ring entry is being published.
const COMPLETING: u64 = 3;

/// A change to the allocator, as logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    Alloc { id: u64, offset: u64, size: u64 },
    Free { id: u64 },
    Export { id: u64, uuid: [u8; 16] },
    Unexport { id: u64 },
    Reset,
}

/// The request a command came from, so a state change and its answer are logged together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    pub head: u16,
    pub nonce: u64,
}

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

/// What was found in the file at start-up.
#[derive(Debug)]
pub struct Restored {
    pub buffers: Vec<Buffer>,
    pub next_id: u64,
    pub note: String,
}

struct LogCursor {
    /// Sequence number of the last change (snapshot or log record).
    seq: u64,
    /// Next free log record.
    next: usize,
    /// Snapshot slot to write next (1 or 2).
    spare: u64,
    /// Answers found in the log at start-up, by nonce.
    answers: BTreeMap<u64, Resp>,
}

pub struct StateFile {
    map: MmapRegion,
    path: Option<PathBuf>,
    max_buffers: usize,
    cursor: Mutex<LogCursor>,
    /// Keeps the file open (and the lock, if taken) for the daemon's life.
    _file: Option<File>,
}

fn words_for(devmem_size: u64) -> usize {
    let max_buffers = (devmem_size / GRANULE) as usize;
    LOG + LOG_RECORDS * RECORD_WORDS + 2 * (SNAP_HEADER + max_buffers * SNAP_BUFFER_WORDS)
}

impl StateFile {
    /// State kept in memory only (tests, fuzzing): same code paths, nothing survives.
    pub fn anonymous(devmem_size: u64) -> Result<StateFile, String> {
        let len = words_for(devmem_size) * 8;
        let map = MmapRegion::new(len).map_err(|e| format!("cannot map state: {e}"))?;
        let s = StateFile::with_map(map, None, None, devmem_size);
        // A new anonymous mapping is all zeros already.
        s.stamp(FileId { dev: 0, ino: 0 }, devmem_size);
        Ok(s)
    }

    /// Opens (or creates) the state file for the memory file `id` of `size` bytes.
    /// `lock`: take the exclusive lock that says "a daemon owns this device" (a worker
    /// restarted by its supervisor runs under the supervisor's lock and passes false).
    /// Returns the state and what was restored from it.
    pub fn open(
        path: &Path,
        id: FileId,
        size: u64,
        lock: bool,
    ) -> Result<(StateFile, Restored), String> {
        let file = if lock {
            self::lock(path)?
        } else {
            open_file(path)?
        };
        let len = (words_for(size) * 8) as u64;
        let on_disk = file
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", path.display()))?
            .len();
        if on_disk != len {
            // Another device size (or a new file): nothing in it applies.
            file.set_len(0)
                .and_then(|_| file.set_len(len))
                .map_err(|e| format!("cannot size state file {}: {e}", path.display()))?;
        }
        files::allocate(&file, len, path, "state file")?;
        let fo = FileOffset::new(
            file.try_clone()
                .map_err(|e| format!("cannot duplicate {}: {e}", path.display()))?,
            0,
        );
        let map = MmapRegion::from_file(fo, len as usize)
            .map_err(|e| format!("cannot map state file {}: {e}", path.display()))?;
        let s = StateFile::with_map(map, Some(path.to_path_buf()), Some(file), size);
        let restored = s.restore(id, size);
        Ok((s, restored))
    }

    fn with_map(
        map: MmapRegion,
        path: Option<PathBuf>,
        file: Option<File>,
        size: u64,
    ) -> StateFile {
        StateFile {
            map,
            path,
            max_buffers: (size / GRANULE) as usize,
            cursor: Mutex::new(LogCursor {
                seq: 0,
                next: 0,
                spare: 1,
                answers: BTreeMap::new(),
            }),
            _file: file,
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // Every index is computed from the fixed layout within the mapped length.
        self.map
            .get_atomic_ref::<AtomicU64>(i * 8)
            .expect("state word inside the mapping")
    }

    fn load(&self, i: usize) -> u64 {
        self.word(i).load(Ordering::Acquire)
    }

    fn store(&self, i: usize, v: u64) {
        self.word(i).store(v, Ordering::Release)
    }

    /// Clears the file and stamps it with the memory file's identity.
    fn format(&self, id: FileId, size: u64) {
        self.store(H_MAGIC, 0);
        for i in 1..LOG + LOG_RECORDS * RECORD_WORDS {
            if self.load(i) != 0 {
                self.store(i, 0);
            }
        }
        self.stamp(id, size);
    }

    /// Writes the header of an otherwise zeroed file; valid from the magic on.
    fn stamp(&self, id: FileId, size: u64) {
        self.store(H_VERSION, VERSION);
        self.store(H_DEV, id.dev);
        self.store(H_INO, id.ino);
        self.store(H_SIZE, size);
        self.store(H_PID, std::process::id() as u64);
        self.store(H_MAGIC, MAGIC);
    }

    fn restore(&self, id: FileId, size: u64) -> Restored {
        let empty = |note: String| Restored {
            buffers: Vec::new(),
            next_id: 1,
            note,
        };
        if self.load(H_MAGIC) != MAGIC {
            self.format(id, size);
            return empty("new state file".into());
        }
        if self.load(H_VERSION) != VERSION
            || self.load(H_DEV) != id.dev
            || self.load(H_INO) != id.ino
            || self.load(H_SIZE) != size
        {
            self.format(id, size);
            return empty("state file belonged to another memory file; started empty".into());
        }
        let writer = self.load(H_PID);
        self.store(H_PID, std::process::id() as u64);
        match self.read_allocator() {
            Ok((buffers, next_id, seq, next, answers)) => {
                let mut c = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
                c.seq = seq;
                c.next = next;
                c.spare = if self.load(H_ACTIVE) == 1 { 2 } else { 1 };
                c.answers = answers;
                let note = format!(
                    "{} buffers restored (state written by pid {writer})",
                    buffers.len()
                );
                Restored {
                    buffers,
                    next_id,
                    note,
                }
            }
            Err(e) => {
                let counters: Vec<u64> = (0..STAT_COUNT).map(|i| self.load(COUNTERS + i)).collect();
                self.format(id, size);
                for (i, v) in counters.into_iter().enumerate() {
                    self.store(COUNTERS + i, v);
                }
                empty(format!("allocator state unreadable ({e}); started empty"))
            }
        }
    }

    /// Snapshot plus log, checked by rebuilding the allocator.
    #[allow(clippy::type_complexity)]
    fn read_allocator(
        &self,
    ) -> Result<(Vec<Buffer>, u64, u64, usize, BTreeMap<u64, Resp>), String> {
        let mut bufs: BTreeMap<u64, Buffer> = BTreeMap::new();
        let mut next_id = 1;
        let mut seq = 0;
        let active = self.load(H_ACTIVE);
        if active == 1 || active == 2 {
            let base = self.slot_base(active);
            let count = self.load(base + 2) as usize;
            if count > self.max_buffers {
                return Err(format!("snapshot claims {count} buffers"));
            }
            let words: Vec<u64> = (0..SNAP_HEADER + count * SNAP_BUFFER_WORDS)
                .map(|i| self.load(base + i))
                .collect();
            if words[0] != snapshot_crc(&words[1..]) as u64 {
                return Err("snapshot checksum mismatch".into());
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
            return Err(format!("bad snapshot slot {active}"));
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
                    next_id = next_id.max(id + 1);
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
                None => return Err(format!("log record {next} is corrupt")),
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
        Ok((buffers, next_id, seq, next, answers))
    }

    fn slot_base(&self, slot: u64) -> usize {
        let slot_words = SNAP_HEADER + self.max_buffers * SNAP_BUFFER_WORDS;
        LOG + LOG_RECORDS * RECORD_WORDS + (slot as usize - 1) * slot_words
    }

    /// Device counters, kept in the file so they survive a restart.
    pub fn counter(&self, i: usize) -> &AtomicU64 {
        assert!(i < 32, "counter index");
        self.word(COUNTERS + i)
    }

    /// Records a state change that has been applied to `alloc` (the caller holds the
    /// allocator's lock), with the response of the command that made it.
    pub fn record(&self, alloc: &Allocator, m: Mutation, origin: Option<Origin>, resp: &Resp) {
        let mut c = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        c.seq += 1;
        if c.next == LOG_RECORDS {
            // Fold everything (this change included) into the spare snapshot slot.
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
        } else {
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
        // Under the same lock as the log, so no snapshot can fold the record away
        // before the journal entry knows its answer.
        if let Some(o) = origin {
            self.answered(o, resp);
        }
    }

    // ---- command queue journal ----

    fn queue_word(q: usize, w: usize) -> usize {
        QUEUES + q * QUEUE_WORDS + w
    }

    fn entry(head: u16, w: usize) -> usize {
        INFLIGHT + head as usize * ENTRY_WORDS + w
    }

    /// A fresh nonce for a request taken from the ring (unique across restarts).
    pub fn next_nonce(&self) -> u64 {
        self.word(H_NONCE).fetch_add(1, Ordering::AcqRel) + 1
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
        if head < size && (head as usize) < MAX_QUEUE {
            self.store(Self::entry(head, E_NONCE), nonce);
            self.store(Self::entry(head, E_TAG), tag);
            self.store(Self::entry(head, E_RESP_GPA), resp.0);
            self.store(
                Self::entry(head, E_PACKED),
                resp.1 as u64 | (pos as u64) << 32,
            );
            self.store(Self::entry(head, E_STATE), RUNNING);
        }
        self.store(
            Self::queue_word(q, Q_NEXT_AVAIL),
            pos.wrapping_add(1) as u64,
        );
    }

    fn answered(&self, o: Origin, resp: &Resp) {
        if o.head as usize >= MAX_QUEUE || self.load(Self::entry(o.head, E_NONCE)) != o.nonce {
            return;
        }
        let (s, r0, r1, _) = resp_words(resp);
        self.store(Self::entry(o.head, E_RESP), s);
        self.store(Self::entry(o.head, E_RESP + 1), r0);
        self.store(Self::entry(o.head, E_RESP + 2), r1);
        self.store(Self::entry(o.head, E_STATE), ANSWERED);
    }

    /// The response (`written` bytes) is in guest memory; the used entry goes to `used_slot`.
    pub fn completing(&self, head: u16, used_slot: u16, written: u32) {
        if head as usize >= MAX_QUEUE {
            return;
        }
        let packed = self.load(Self::entry(head, E_PACKED)) & 0x0000_ffff_ffff_ffff;
        self.store(
            Self::entry(head, E_PACKED),
            packed | (used_slot as u64) << 48,
        );
        self.store(Self::entry(head, E_RESP), written as u64);
        self.store(Self::entry(head, E_STATE), COMPLETING);
    }

    /// The request is back with the driver.
    pub fn release(&self, head: u16) {
        if (head as usize) < MAX_QUEUE {
            self.store(Self::entry(head, E_STATE), FREE);
        }
    }

    /// The front-end stopped ring `q`: nothing in it is ours to answer any more.
    pub fn clear_ring(&self, q: usize) {
        self.store(Self::queue_word(q, Q_VALID), 0);
        // Rings may have any size up to the maximum; only entries in use are written.
        for head in 0..MAX_QUEUE {
            if self.load(Self::entry(head as u16, E_STATE)) != FREE {
                self.release(head as u16);
            }
        }
    }

    /// Requests the previous daemon took from ring `q` (taken before avail position
    /// `next_avail`) and did not return.
    pub fn pending(&self, size: u16, next_avail: u16) -> Vec<Pending> {
        let answers = self
            .cursor
            .lock()
            .map(|c| c.answers.clone())
            .unwrap_or_default();
        let mut out = Vec::new();
        for head in 0..(size as usize).min(MAX_QUEUE) {
            let head = head as u16;
            let state = self.load(Self::entry(head, E_STATE));
            if state == FREE {
                continue;
            }
            let packed = self.load(Self::entry(head, E_PACKED));
            let pos = (packed >> 32) as u16;
            // Recorded but the position never moved past it: it is still in the ring
            // and will be taken again.
            if pos.wrapping_sub(next_avail) as i16 >= 0 {
                self.release(head);
                continue;
            }
            let nonce = self.load(Self::entry(head, E_NONCE));
            let outcome = match state {
                ANSWERED => Outcome::Answered(resp_from(
                    self.load(Self::entry(head, E_TAG)),
                    self.load(Self::entry(head, E_RESP)),
                    self.load(Self::entry(head, E_RESP + 1)),
                    self.load(Self::entry(head, E_RESP + 2)),
                )),
                COMPLETING => Outcome::Completing {
                    used_slot: (packed >> 48) as u16,
                    written: self.load(Self::entry(head, E_RESP)) as u32,
                },
                _ => match answers.get(&nonce) {
                    Some(r) => Outcome::Answered(*r),
                    None => Outcome::Unknown,
                },
            };
            out.push(Pending {
                head,
                tag: self.load(Self::entry(head, E_TAG)),
                resp_gpa: self.load(Self::entry(head, E_RESP_GPA)),
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

/// Takes the "a daemon owns this device" lock on the state file (a supervisor holds it
/// for its workers), so two daemons cannot share one state either. The lock lasts as long
/// as the returned file is open.
pub fn lock(path: &Path) -> Result<File, String> {
    let file = open_file(path)?;
    files::lock_exclusive(&file, path, "state file")?;
    Ok(file)
}

/// The state file is the daemon's alone: mode 0600, never through a link.
fn open_file(path: &Path) -> Result<File, String> {
    files::open_private(path, "state file", None)
}

fn snapshot_crc(words: &[u64]) -> u32 {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    crc32c(0, &bytes)
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

fn resp_words(r: &Resp) -> (u64, u64, u64, u64) {
    (
        r.status as u64 | (r.detail as u64) << 32,
        r.result0,
        r.result1,
        r.tag,
    )
}

fn resp_from(tag: u64, status_detail: u64, result0: u64, result1: u64) -> Resp {
    Resp {
        tag,
        status: status_detail as u32,
        detail: (status_detail >> 32) as u32,
        result0,
        result1,
    }
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

    const SIZE: u64 = 64 << 20;

    fn temp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("cxl-state-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    fn id() -> FileId {
        FileId { dev: 7, ino: 42 }
    }

    fn ok(result0: u64) -> Resp {
        Resp {
            tag: 9,
            result0,
            ..Default::default()
        }
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
            let m = Mutation::Alloc {
                id: b.id,
                offset: b.offset,
                size: b.size,
            };
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
    fn a_torn_log_record_is_not_replayed() {
        let path = temp("torn");
        let (s, _) = StateFile::open(&path, id(), SIZE, false).unwrap();
        let mut a = Allocator::new(SIZE);
        let b = a.alloc(8192, 0).unwrap();
        let m = Mutation::Alloc {
            id: b.id,
            offset: b.offset,
            size: b.size,
        };
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

    #[test]
    fn the_journal_tells_what_each_request_in_flight_needs() {
        let s = StateFile::anonymous(SIZE).unwrap();
        let ring = RingId {
            desc: 0x1000,
            avail: 0x2000,
            used: 0x3000,
            size: 8,
        };
        s.set_ring(0, ring, 10);
        let mut a = Allocator::new(SIZE);
        // Head 1: running, unknown outcome. Head 2: an allocation that took effect.
        // Head 3: being published. Head 4: journaled but the position never moved past
        // it (still in the ring). Head 5: answered through the log only.
        s.begin(0, 1, 8, 10, 101, 1, (0x9000, 32));
        s.begin(0, 2, 8, 11, 102, 2, (0x9100, 32));
        let b = a.alloc(4096, 0).unwrap();
        let m = Mutation::Alloc {
            id: b.id,
            offset: b.offset,
            size: b.size,
        };
        s.record(
            &a,
            m,
            Some(Origin {
                head: 2,
                nonce: 102,
            }),
            &ok(b.id),
        );
        s.begin(0, 3, 8, 12, 103, 3, (0x9200, 32));
        s.completing(3, 5, 32);
        s.begin(0, 5, 8, 13, 105, 5, (0x9300, 32));
        s.begin(0, 4, 8, 14, 104, 4, (0x9400, 32));
        s.store(StateFile::queue_word(0, Q_NEXT_AVAIL), 14);
        s.cursor.lock().unwrap().answers.insert(105, ok(55));
        // A head beyond the ring is never journaled.
        s.begin(0, 9, 8, 14, 109, 9, (0x9500, 32));
        assert_eq!(s.ring_position(0, ring), Some(15));
        s.store(StateFile::queue_word(0, Q_NEXT_AVAIL), 14);
        assert_eq!(s.ring_position(0, RingId { size: 16, ..ring }), None);
        let p = s.pending(8, 14);
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
        s.release(1);
        assert_eq!(s.pending(8, 14).len(), 3);
        s.clear_ring(0);
        assert!(s.pending(8, 14).is_empty());
        assert_eq!(s.ring_position(0, ring), None);
    }
}
