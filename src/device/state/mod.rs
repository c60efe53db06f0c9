// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Crash-safe device state: a small file next to the memory file, mapped shared, so that a
//! daemon killed at any instruction leaves a consistent record for the one that replaces it.
//!
//! It holds the device counters, the allocator's log ([`alloc_log`]: a snapshot plus a
//! write-ahead log of allocations, frees and exports) and the command queue's journal
//! ([`crate::ring::journal`]: where the queue stood and which requests were taken but not
//! yet returned). Every multi-word record is written first and made valid by one 8-byte
//! store last, so a torn record is never read. The kernel's page cache keeps the stores
//! when the process dies; surviving a host crash is out of scope (nothing is fsynced on
//! the command path).

pub mod alloc_log;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vm_memory::{FileOffset, MmapRegion, VolatileMemory};

use crate::device::allocator::{Buffer, GRANULE};
use crate::device::devmem::FileId;
use crate::host::files::{self, FileError};
use crate::protocol::{Resp, STAT_COUNT};
use alloc_log::LogCursor;
pub use alloc_log::Mutation;

const MAGIC: u64 = u64::from_le_bytes(*b"CXLASTA1");
/// 2: the journal has entries for the command queues after the first (version 1.1).
/// 3: the saved register state of `--attach cxl` ([`Saved`]) before the allocator's log.
const VERSION: u64 = 3;

// Layout, in 8-byte words: header, counters, the ring journal, saved register state, the
// allocator's log.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_DEV: usize = 2;
const H_INO: usize = 3;
const H_SIZE: usize = 4;
const H_PID: usize = 5;
/// 0: no snapshot, 1 or 2: the valid snapshot slot.
const H_ACTIVE: usize = 6;
/// The last nonce given to a request taken from a ring.
pub(crate) const H_NONCE: usize = 7;
/// Where the guest sees device memory (its BAR), with bit 0 set; 0 while unmapped. For
/// peers' daemons: vfio-user maps another device's BAR into ours without its file, so
/// they read it here to tell which peer's memory a mapping is (`guest_address_of`).
const H_GUEST_ADDRESS: usize = 8;
const COUNTERS: usize = 64;
/// Where the ring journal starts.
pub(crate) const JOURNAL: usize = 128;
/// Where the saved register state starts.
const SAVED: usize = JOURNAL + journal_region::WORDS;
/// Where the allocator's log starts.
const LOG: usize = SAVED + Saved::REGION_WORDS;

/// Register state a transport keeps for a restarted daemon (`--attach cxl` under
/// `--supervise`: the PCI function's registers live in the daemon, not in QEMU). Each kind
/// has two slots and a word naming the whole one, switched by one store after the other
/// slot is written, so a daemon killed mid-save leaves the previous state readable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// The CXL registers of the device model (`crate::device::cxl`).
    Cxl,
    /// The PCI function: config space, BARs, virtio registers (`crate::vfio::function`).
    Function,
}

impl Saved {
    /// The largest state of each kind, in words.
    pub const fn capacity(self) -> usize {
        match self {
            Saved::Cxl => 64,
            Saved::Function => 1024,
        }
    }

    /// A kind's words: the active-slot word, then two slots of a length word and the data.
    const fn words(self) -> usize {
        1 + 2 * (1 + self.capacity())
    }

    const fn start(self) -> usize {
        match self {
            Saved::Cxl => SAVED,
            Saved::Function => SAVED + Saved::Cxl.words(),
        }
    }

    const REGION_WORDS: usize = Saved::Cxl.words() + Saved::Function.words();
}

/// The ring journal's region (its contents are the ring layer's, `crate::ring::journal`):
/// a block per ring, then an entry per request a ring can hold. The entry layout lives
/// here because the allocator's log writes an entry's answer under its own lock
/// ([`StateFile::journal_answered`]).
pub mod journal_region {
    use crate::protocol::{cmd_queue_of, MAX_CMD_QUEUES};

    /// Largest queue the journal can describe (the virtio maximum).
    pub const MAX_QUEUE: usize = 32768;
    /// Largest ring of the command queues after the first (QEMU's own limit for a ring a
    /// guest chooses): the journal has this many entries for each of them.
    pub const MAX_EXTRA_QUEUE: usize = 1024;
    /// Where the entries start, in 8-byte words (the rings' blocks come first).
    pub const INFLIGHT: usize = 384;
    /// Words per entry.
    pub const ENTRY_WORDS: usize = 8;
    /// The region's length in words.
    pub const WORDS: usize =
        INFLIGHT + (MAX_QUEUE + (MAX_CMD_QUEUES - 1) * MAX_EXTRA_QUEUE) * ENTRY_WORDS;

    /// Words of an entry.
    pub const E_STATE: usize = 0;
    pub const E_NONCE: usize = 1;
    pub const E_TAG: usize = 2;
    pub const E_RESP_GPA: usize = 3;
    /// resp_len (32 bits) | avail position << 32 | used slot << 48
    pub const E_PACKED: usize = 4;
    /// ANSWERED: status | detail << 32, result0, result1. COMPLETING: bytes written.
    pub const E_RESP: usize = 5;

    /// Entry states.
    pub const FREE: u64 = 0;
    /// Taken from the ring; outcome unknown.
    pub const RUNNING: u64 = 1;
    /// A state-changing command took effect; its response is recorded.
    pub const ANSWERED: u64 = 2;
    /// The response is in guest memory; the used-ring entry is being published.
    pub const COMPLETING: u64 = 3;

    /// How many heads of virtqueue `q` the journal has entries for (0: not a command queue).
    pub fn capacity(q: usize) -> usize {
        match cmd_queue_of(q) {
            Some(0) => MAX_QUEUE,
            Some(k) if k < MAX_CMD_QUEUES => MAX_EXTRA_QUEUE,
            _ => 0,
        }
    }

    /// Word `w` of the entry of `head` in virtqueue `q`, from the state file's start;
    /// callers check the head against [`capacity`] first.
    pub fn entry(q: usize, head: u16, w: usize) -> usize {
        let slot = match cmd_queue_of(q) {
            Some(k) if k > 0 => MAX_QUEUE + (k - 1) * MAX_EXTRA_QUEUE + head as usize,
            _ => head as usize,
        };
        super::JOURNAL + INFLIGHT + slot * ENTRY_WORDS + w
    }
}

/// The request a command came from (its queue, descriptor head and the journal's nonce),
/// so that a state change and its answer are logged together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The virtqueue the request came from.
    pub queue: u16,
    pub head: u16,
    pub nonce: u64,
}
/// What was found in the file at start-up.
#[derive(Debug)]
pub struct Restored {
    pub buffers: Vec<Buffer>,
    pub next_id: u64,
    pub note: String,
}

/// Why the state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot map state: {0}")]
    Anonymous(vm_memory::mmap::MmapRegionError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("cannot stat {}: {source}", .path.display())]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot size state file {}: {source}", .path.display())]
    Size {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot duplicate {}: {source}", .path.display())]
    Duplicate {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot map state file {}: {source}", .path.display())]
    Map {
        path: PathBuf,
        source: vm_memory::mmap::MmapRegionError,
    },
}

pub struct StateFile {
    map: MmapRegion,
    path: Option<PathBuf>,
    max_buffers: usize,
    cursor: Mutex<LogCursor>,
    /// One save at a time (callers on several threads share a kind's spare slot).
    saving: Mutex<()>,
    /// Keeps the file open (and the lock, if taken) for the daemon's life.
    _file: Option<File>,
}

fn words_for(devmem_size: u64) -> usize {
    LOG + alloc_log::words((devmem_size / GRANULE) as usize)
}

impl StateFile {
    /// State kept in memory only (tests, fuzzing): same code paths, nothing survives.
    pub fn anonymous(devmem_size: u64) -> Result<StateFile, StateError> {
        let len = words_for(devmem_size) * 8;
        let map = MmapRegion::new(len).map_err(StateError::Anonymous)?;
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
    ) -> Result<(StateFile, Restored), StateError> {
        let file = if lock {
            self::lock(path)?
        } else {
            open_file(path)?
        };
        let len = (words_for(size) * 8) as u64;
        let at = || path.to_path_buf();
        let on_disk = file
            .metadata()
            .map_err(|source| StateError::Stat { path: at(), source })?
            .len();
        if on_disk != len {
            // Another device size (or a new file): nothing in it applies.
            file.set_len(0)
                .and_then(|_| file.set_len(len))
                .map_err(|source| StateError::Size { path: at(), source })?;
        }
        files::allocate(&file, len, path, "state file")?;
        let copy = file
            .try_clone()
            .map_err(|source| StateError::Duplicate { path: at(), source })?;
        let map = MmapRegion::from_file(FileOffset::new(copy, 0), len as usize)
            .map_err(|source| StateError::Map { path: at(), source })?;
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
            cursor: Mutex::new(LogCursor::new()),
            saving: Mutex::new(()),
            _file: file,
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        // Every index is computed from the fixed layout within the mapped length.
        self.map
            .get_atomic_ref::<AtomicU64>(i * 8)
            .expect("state word inside the mapping")
    }

    pub(crate) fn load(&self, i: usize) -> u64 {
        self.word(i).load(Ordering::Acquire)
    }

    pub(crate) fn store(&self, i: usize, v: u64) {
        self.word(i).store(v, Ordering::Release)
    }

    /// Clears the file and stamps it with the memory file's identity.
    fn format(&self, id: FileId, size: u64) {
        self.store(H_MAGIC, 0);
        for i in 1..LOG + alloc_log::LOG_WORDS {
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
        let version = self.load(H_VERSION);
        if version != VERSION {
            self.format(id, size);
            return empty(format!(
                "state file of format version {version}, this daemon's is {VERSION}; started \
                 empty (allocations of the previous daemon are gone)"
            ));
        }
        if self.load(H_DEV) != id.dev || self.load(H_INO) != id.ino || self.load(H_SIZE) != size {
            self.format(id, size);
            return empty("state file belonged to another memory file; started empty".into());
        }
        let writer = self.load(H_PID);
        self.store(H_PID, std::process::id() as u64);
        match self.read_allocator() {
            Ok(back) => {
                let (buffers, next_id) = (back.buffers, back.next_id);
                let mut c = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
                c.seq = back.seq;
                c.next = back.next;
                c.spare = if self.load(H_ACTIVE) == 1 { 2 } else { 1 };
                c.answers = back.answers;
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

    /// Publishes where the guest sees device memory (None: not mapped), for peers.
    pub fn set_guest_address(&self, gpa: Option<u64>) {
        // BAR addresses are page aligned: bit 0 marks a valid one.
        self.store(H_GUEST_ADDRESS, gpa.map_or(0, |a| a | 1));
    }

    /// Saves register state of `kind` (at most [`Saved::capacity`] words: false if more).
    pub fn save(&self, kind: Saved, words: &[u64]) -> bool {
        if words.len() > kind.capacity() {
            return false;
        }
        let _one = self.saving.lock().unwrap_or_else(|e| e.into_inner());
        let start = kind.start();
        let spare = if self.load(start) == 1 { 2 } else { 1 };
        let slot = start + 1 + (spare - 1) * (1 + kind.capacity());
        self.store(slot, words.len() as u64);
        for (i, &w) in words.iter().enumerate() {
            self.store(slot + 1 + i, w);
        }
        self.store(start, spare as u64);
        true
    }

    /// The register state of `kind` last saved, if any.
    pub fn saved(&self, kind: Saved) -> Option<Vec<u64>> {
        let start = kind.start();
        let active = self.load(start);
        if !(1..=2).contains(&active) {
            return None;
        }
        let slot = start + 1 + (active as usize - 1) * (1 + kind.capacity());
        let len = self.load(slot) as usize;
        (len <= kind.capacity()).then(|| (0..len).map(|i| self.load(slot + 1 + i)).collect())
    }

    /// Drops the saved state of `kind` (a daemon that starts afresh).
    pub fn forget(&self, kind: Saved) {
        self.store(kind.start(), 0);
    }

    /// Device counters, kept in the file so they survive a restart.
    pub fn counter(&self, i: usize) -> &AtomicU64 {
        assert!(i < 32, "counter index");
        self.word(COUNTERS + i)
    }
}

/// Where the guest sees the device memory of another daemon, from that daemon's state
/// file `state` (opened for reading), if it is the state of the memory file `id`.
pub fn guest_address_of(state: &File, id: FileId) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut header = [0u8; (H_GUEST_ADDRESS + 1) * 8];
    state.read_exact_at(&mut header, 0).ok()?;
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&header[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w)
    };
    let ours = word(H_MAGIC) == MAGIC
        && word(H_VERSION) == VERSION
        && word(H_DEV) == id.dev
        && word(H_INO) == id.ino;
    let a = word(H_GUEST_ADDRESS);
    (ours && a & 1 != 0).then_some(a & !1)
}

/// Takes the "a daemon owns this device" lock on the state file (a supervisor holds it
/// for its workers), so two daemons cannot share one state either. The lock lasts as long
/// as the returned file is open.
pub fn lock(path: &Path) -> Result<File, FileError> {
    let file = open_file(path)?;
    files::lock_exclusive(&file, path, "state file")?;
    Ok(file)
}

/// The state file is the daemon's alone: mode 0600, never through a link.
fn open_file(path: &Path) -> Result<File, FileError> {
    files::open_private(path, "state file", None)
}

/// A response as log and journal words: status | detail << 32, result0, result1, tag.
pub(crate) fn resp_words(r: &Resp) -> (u64, u64, u64, u64) {
    (
        r.status as u64 | (r.detail as u64) << 32,
        r.result0,
        r.result1,
        r.tag,
    )
}

/// The inverse of [`resp_words`].
pub(crate) fn resp_from(tag: u64, status_detail: u64, result0: u64, result1: u64) -> Resp {
    Resp {
        tag,
        status: status_detail as u32,
        detail: (status_detail >> 32) as u32,
        result0,
        result1,
    }
}

impl StateFile {
    /// Answers the allocator's log held at start-up, by nonce (for the ring journal).
    pub(crate) fn logged_answers(&self) -> BTreeMap<u64, Resp> {
        self.cursor
            .lock()
            .map(|c| c.answers.clone())
            .unwrap_or_default()
    }

    /// A state change made by request `o` took effect with this response: its journal
    /// entry says so (unless the entry is another request's by now).
    pub(crate) fn journal_answered(&self, o: Origin, resp: &Resp) {
        use journal_region::{capacity, entry, ANSWERED, E_NONCE, E_RESP, E_STATE};
        let q = o.queue as usize;
        if o.head as usize >= capacity(q) || self.load(entry(q, o.head, E_NONCE)) != o.nonce {
            return;
        }
        let (s, r0, r1, _) = resp_words(resp);
        self.store(entry(q, o.head, E_RESP), s);
        self.store(entry(q, o.head, E_RESP + 1), r0);
        self.store(entry(q, o.head, E_RESP + 2), r1);
        self.store(entry(q, o.head, E_STATE), ANSWERED);
    }

    /// Test hook: an answer as if found in the log at start-up.
    #[cfg(test)]
    pub(crate) fn note_logged_answer(&self, nonce: u64, resp: Resp) {
        if let Ok(mut c) = self.cursor.lock() {
            c.answers.insert(nonce, resp);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A successful response with `result0`, as the log and journal tests record.
    pub(crate) fn ok(result0: u64) -> Resp {
        Resp {
            tag: 9,
            result0,
            ..Default::default()
        }
    }

    #[test]
    fn a_state_file_of_another_version_starts_empty_and_says_so() {
        let path = std::env::temp_dir().join(format!("cxl-state-{}-ver", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let id = FileId { dev: 7, ino: 42 };
        let (s, _) = StateFile::open(&path, id, 64 << 20, false).unwrap();
        s.store(H_VERSION, VERSION - 1);
        drop(s);
        let (_s, restored) = StateFile::open(&path, id, 64 << 20, false).unwrap();
        assert!(
            restored
                .note
                .contains(&format!("format version {}", VERSION - 1)),
            "{}",
            restored.note
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn saved_state_reads_back_the_last_whole_save() {
        let s = StateFile::anonymous(256 << 20).unwrap();
        assert_eq!(s.saved(Saved::Cxl), None);
        assert!(s.save(Saved::Cxl, &[1, 2, 3]));
        assert!(s.save(Saved::Function, &[9; 1024]));
        assert!(!s.save(Saved::Cxl, &[0; 65]), "longer than the slot");
        assert_eq!(s.saved(Saved::Cxl), Some(vec![1, 2, 3]));
        assert!(s.save(Saved::Cxl, &[4]));
        assert_eq!(s.saved(Saved::Cxl), Some(vec![4]));
        assert_eq!(s.saved(Saved::Function), Some(vec![9; 1024]));
        // A save cut short (its slot written, the switch not made) leaves the last one.
        let spare = Saved::Cxl.start() + 1;
        s.store(spare, 2);
        s.store(spare + 1, 7);
        assert_eq!(s.saved(Saved::Cxl), Some(vec![4]));
        s.forget(Saved::Cxl);
        assert_eq!(s.saved(Saved::Cxl), None);
        assert_eq!(s.saved(Saved::Function), Some(vec![9; 1024]));
    }

    #[test]
    fn a_peer_reads_where_the_guest_sees_our_memory_from_our_state_file() {
        let path = std::env::temp_dir().join(format!("cxl-state-{}-gpa", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let id = FileId { dev: 7, ino: 42 };
        let (s, _) = StateFile::open(&path, id, 64 << 20, false).unwrap();
        let peer_view = File::open(&path).unwrap();
        assert_eq!(guest_address_of(&peer_view, id), None);
        s.set_guest_address(Some(0x1_2000_0000));
        assert_eq!(guest_address_of(&peer_view, id), Some(0x1_2000_0000));
        // The state of another memory file says nothing about this one.
        assert_eq!(
            guest_address_of(&peer_view, FileId { dev: 7, ino: 43 }),
            None
        );
        s.set_guest_address(None);
        assert_eq!(guest_address_of(&peer_view, id), None);
        // Opening the state says nothing of where the guest sees the memory: a worker
        // that takes over keeps it published, one that starts afresh withdraws it.
        s.set_guest_address(Some(0x8000_0000));
        drop(s);
        let (s, _) = StateFile::open(&path, id, 64 << 20, false).unwrap();
        assert_eq!(guest_address_of(&peer_view, id), Some(0x8000_0000));
        s.set_guest_address(None);
        assert_eq!(guest_address_of(&peer_view, id), None);
        let _ = std::fs::remove_file(&path);
    }
}
