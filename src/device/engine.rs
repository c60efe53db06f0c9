// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The DMA/compute engine: resolves address ranges against guest and device memory and
//! executes data commands. A range is checked in full before a single byte moves.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress, VolatileMemory, VolatileSlice,
};

use crate::device::devmem::DeviceMemory;
use crate::device::faults::Faults;
use crate::protocol::{
    Atomic, Sge, Status, ATOMIC_CMPXCHG, ATOMIC_FETCH_ADD, ATOMIC_SWAP, SPACE_DEVMEM, SPACE_GPA,
};

/// What the engine may touch: a snapshot of guest memory, device memory, and which
/// guest-physical ranges are other devices' memory (for peer-to-peer accounting).
pub struct Ctx<'a> {
    pub guest: &'a GuestMemoryMmap,
    pub devmem: &'a DeviceMemory,
    pub peers: &'a [(u64, u64)],
    /// Where the guest maps our own device memory: such ranges are served from our own
    /// mapping, so the same bytes named by offset and by address are recognised as one.
    pub devmem_gpa: Option<u64>,
    /// Set when the front-end stops the queue: long operations end early, INTERRUPTED.
    pub cancel: &'a AtomicBool,
    /// Poisoned device memory: touching it is a MEDIA_ERROR.
    pub faults: &'a Faults,
    /// The first poisoned offset a failed resolution met (the MEDIA_ERROR's detail).
    pub poisoned_at: std::cell::Cell<Option<u64>>,
}

/// A cancel flag that is never set, for commands nobody can stop.
pub static NEVER: AtomicBool = AtomicBool::new(false);

/// A piece of a resolved range that is contiguous in our address space.
pub struct Chunk<'a> {
    pub slice: VolatileSlice<'a>,
    pub peer: bool,
}

/// Error of a list operation: status and the index of the offending entry.
pub type ListError = (Status, u32);

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub bytes: u64,
    pub peer_bytes: u64,
}

const BOUNCE: usize = 64 * 1024;
/// Most bytes a copy moves between two looks at the cancel flag.
const COPY_STEP: usize = 1 << 20;
/// Atomic operations between two looks at the cancel flag.
const ATOMIC_STEP: u64 = 4096;

const CANCELLED: ListError = (Status::Interrupted, 0);

impl<'a> Ctx<'a> {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn is_peer(&self, gpa: u64) -> bool {
        self.peers
            .iter()
            .any(|&(start, len)| gpa >= start && gpa - start < len)
    }

    /// Where `gpa` falls in our own device memory, as the guest sees it: the offset and
    /// the bytes from there to its end.
    fn own_devmem_at(&self, gpa: u64) -> Option<(u64, u64)> {
        let off = gpa.checked_sub(self.devmem_gpa?)?;
        let size = self.devmem.size();
        (off < size).then(|| (off, size - off))
    }

    /// MEDIA_ERROR when [off, off + len) of device memory is poisoned.
    fn check_poison(&self, off: u64, len: u64) -> Result<(), Status> {
        match self.faults.first_poisoned(off, len) {
            Some(at) => {
                self.poisoned_at.set(Some(at));
                Err(Status::MediaError)
            }
            None => Ok(()),
        }
    }

    /// Resolves `len` bytes at `addr` in `space` into chunks, or fails without side effects.
    pub fn resolve(&self, space: u16, addr: u64, len: u64) -> Result<Vec<Chunk<'a>>, Status> {
        addr.checked_add(len).ok_or(Status::Overflow)?;
        usize::try_from(len).map_err(|_| Status::Overflow)?;
        match space {
            SPACE_DEVMEM => {
                if len == 0 {
                    return Ok(Vec::new());
                }
                let slice = self.devmem.slice(addr, len).ok_or(Status::BadDevmem)?;
                self.check_poison(addr, len)?;
                Ok(vec![Chunk { slice, peer: false }])
            }
            SPACE_GPA => {
                let mut out = Vec::new();
                let (mut gpa, mut left) = (addr, len);
                while left > 0 {
                    // Our own BAR first: a transport may not list it in guest memory
                    // (vfio-user maps it without its file), and where it does, the
                    // same bytes are named by offset and by address alike.
                    let (slice, peer) = match self.own_devmem_at(gpa) {
                        Some((off, room)) => {
                            let n = left.min(room);
                            self.check_poison(off, n)?;
                            (self.devmem.slice(off, n).ok_or(Status::BadGpa)?, false)
                        }
                        None => {
                            let region = self
                                .guest
                                .find_region(GuestAddress(gpa))
                                .ok_or(Status::BadGpa)?;
                            let at = gpa - region.start_addr().0;
                            let mut n = left.min(region.len() - at);
                            if let Some(own) = self.devmem_gpa.filter(|&o| o > gpa) {
                                n = n.min(own - gpa);
                            }
                            let n = usize::try_from(n).map_err(|_| Status::Overflow)?;
                            let slice = region
                                .get_slice(MemoryRegionAddress(at), n)
                                .map_err(|_| Status::BadGpa)?;
                            (slice, self.is_peer(gpa))
                        }
                    };
                    gpa += slice.len() as u64;
                    left -= slice.len() as u64;
                    out.push(Chunk { slice, peer });
                }
                Ok(out)
            }
            _ => Err(Status::Invalid),
        }
    }

    pub fn resolve_list(&self, list: &[Sge]) -> Result<Vec<Chunk<'a>>, ListError> {
        let mut out = Vec::new();
        for (i, s) in list.iter().enumerate() {
            let chunks = self
                .resolve(s.space, s.addr, s.len as u64)
                .map_err(|e| (e, i as u32))?;
            out.extend(chunks);
        }
        Ok(out)
    }

    pub fn copy(&self, src: &[Sge], dst: &[Sge]) -> Result<Moved, ListError> {
        let s = self.resolve_list(src)?;
        let d = self
            .resolve_list(dst)
            .map_err(|(e, i)| (e, i + src.len() as u32))?;
        copy_chunks(&s, &d, self.cancel).ok_or(CANCELLED)
    }

    pub fn fill(&self, pattern: u64, dst: &[Sge]) -> Result<Moved, ListError> {
        let d = self.resolve_list(dst)?;
        let pat = pattern.to_le_bytes();
        // The buffer is 8-byte periodic, so any window starting at phase p is pattern[p..].
        let buf: Vec<u8> = (0..BOUNCE + 8).map(|i| pat[i % 8]).collect();
        let mut stream = 0u64;
        self.in_steps(&d, |slice, off, n| {
            let phase = (stream % 8) as usize;
            // Cannot fail: off + n is within the slice.
            let _ = slice.write_slice(&buf[phase..phase + n], off);
            stream += n as u64;
        })
    }

    pub fn checksum(&self, seed: u32, src: &[Sge]) -> Result<(u32, Moved), ListError> {
        let s = self.resolve_list(src)?;
        let mut crc = seed;
        let mut buf = vec![0u8; BOUNCE];
        let moved = self.in_steps(&s, |slice, off, n| {
            let _ = slice.read_slice(&mut buf[..n], off);
            crc = crc32c::crc32c_append(crc, &buf[..n]);
        })?;
        Ok((crc, moved))
    }

    /// Calls `step(slice, offset, len)` over `chunks` in steps of at most [`BOUNCE`]
    /// bytes, looking for a cancellation before each.
    fn in_steps(
        &self,
        chunks: &[Chunk<'a>],
        mut step: impl FnMut(&VolatileSlice<'a>, usize, usize),
    ) -> Result<Moved, ListError> {
        let mut moved = Moved::default();
        for c in chunks {
            let mut off = 0;
            while off < c.slice.len() {
                if self.cancelled() {
                    return Err(CANCELLED);
                }
                let n = (c.slice.len() - off).min(BOUNCE);
                step(&c.slice, off, n);
                off += n;
            }
            moved.bytes += c.slice.len() as u64;
            if c.peer {
                moved.peer_bytes += c.slice.len() as u64;
            }
        }
        Ok(moved)
    }

    /// Executes an atomic operation; returns (old value of the last operation, operations).
    pub fn atomic(&self, a: &Atomic) -> Result<(u64, u64), Status> {
        let chunks = self.resolve(a.space, a.addr, a.width as u64)?;
        let [c] = chunks.as_slice() else {
            return Err(Status::Unaligned);
        };
        let repeat = if a.op == ATOMIC_FETCH_ADD {
            a.repeat
        } else {
            1
        };
        match a.width {
            8 => {
                let w = c
                    .slice
                    .get_atomic_ref::<AtomicU64>(0)
                    .map_err(|_| Status::Unaligned)?;
                apply(w, a, repeat, self.cancel)
            }
            4 => {
                let w = c
                    .slice
                    .get_atomic_ref::<AtomicU32>(0)
                    .map_err(|_| Status::Unaligned)?;
                apply(&Atomic32(w), a, repeat, self.cancel)
            }
            _ => Err(Status::Invalid),
        }
    }

    /// Batched page copy; every page of both lists is checked before any data moves.
    pub fn copy_pages(
        &self,
        page_size: u32,
        src_space: u16,
        dst_space: u16,
        src: &[u64],
        dst: &[u64],
    ) -> Result<Moved, ListError> {
        let ps = page_size as u64;
        let mut pairs = Vec::with_capacity(src.len());
        for (i, (&s, &d)) in src.iter().zip(dst).enumerate() {
            if s % ps != 0 {
                return Err((Status::Unaligned, i as u32));
            }
            if d % ps != 0 {
                return Err((Status::Unaligned, (src.len() + i) as u32));
            }
            let sc = self.resolve(src_space, s, ps).map_err(|e| (e, i as u32))?;
            let dc = self
                .resolve(dst_space, d, ps)
                .map_err(|e| (e, (src.len() + i) as u32))?;
            pairs.push((sc, dc));
        }
        let mut moved = Moved::default();
        for (sc, dc) in &pairs {
            let m = copy_chunks(sc, dc, self.cancel).ok_or(CANCELLED)?;
            moved.bytes += m.bytes;
            moved.peer_bytes += m.peer_bytes;
        }
        Ok(moved)
    }
}

/// Copies between two chunk lists of equal total length; None when cancelled part-way.
/// The copy moves at most [`COPY_STEP`] bytes at a time (a look at the cancel flag
/// between steps), and as by `memmove` when source and destination overlap: the steps
/// run from the end when the destination lies above the source, so no step overwrites
/// bytes a later step still reads. (With lists of several entries that overlap each
/// other out of order no step order is right; the spec leaves that result unspecified.)
fn copy_chunks(src: &[Chunk], dst: &[Chunk], cancel: &AtomicBool) -> Option<Moved> {
    let mut moved = Moved::default();
    let mut run = |(i, si, j, dj, n): Step| {
        if cancel.load(Ordering::Relaxed) {
            return false;
        }
        let (s, d) = (&src[i], &dst[j]);
        // Offsets and lengths stay within both slices by construction. vm-memory copies
        // with ptr::copy (memmove), so a step overlapping itself comes out right.
        if let (Ok(from), Ok(to)) = (s.slice.subslice(si, n), d.slice.subslice(dj, n)) {
            from.copy_to_volatile_slice(to);
        }
        moved.bytes += n as u64;
        if s.peer || d.peer {
            moved.peer_bytes += n as u64;
        }
        true
    };
    // Only a backward copy needs the steps listed; the usual forward one takes them as
    // they come.
    let done = if destination_above_overlapping_source(src, dst) {
        let steps: Vec<Step> = pair_steps(src, dst).collect();
        steps.into_iter().rev().all(&mut run)
    } else {
        pair_steps(src, dst).all(&mut run)
    };
    done.then_some(moved)
}

/// One step of a copy: (source chunk, offset in it, destination chunk, offset in it,
/// length).
type Step = (usize, usize, usize, usize, usize);

/// The steps of a copy in stream order, each within one chunk on both sides and at most
/// COPY_STEP long.
fn pair_steps<'a>(src: &'a [Chunk], dst: &'a [Chunk]) -> impl Iterator<Item = Step> + 'a {
    let (mut i, mut j, mut si, mut dj) = (0, 0, 0usize, 0usize);
    std::iter::from_fn(move || {
        while i < src.len() && j < dst.len() {
            let n = (src[i].slice.len() - si)
                .min(dst[j].slice.len() - dj)
                .min(COPY_STEP);
            let step = (i, si, j, dj, n);
            si += n;
            dj += n;
            if si == src[i].slice.len() {
                i += 1;
                si = 0;
            }
            if dj == dst[j].slice.len() {
                j += 1;
                dj = 0;
            }
            if n > 0 {
                return Some(step);
            }
        }
        None
    })
}

/// Whether some destination chunk overlaps some source chunk and starts above it (in
/// our address space, where the same bytes named twice have one address). Long lists
/// are judged by their envelopes: pairwise would cost millions of comparisons.
fn destination_above_overlapping_source(src: &[Chunk], dst: &[Chunk]) -> bool {
    let span = |c: &Chunk| {
        let start = c.slice.ptr_guard().as_ptr() as usize;
        (start, start + c.slice.len())
    };
    let above = |(d0, d1): (usize, usize), (s0, s1): (usize, usize)| d0 < s1 && s0 < d1 && d0 > s0;
    if src.len() * dst.len() <= 4096 {
        return dst
            .iter()
            .any(|d| src.iter().any(|s| above(span(d), span(s))));
    }
    let envelope = |list: &[Chunk]| {
        list.iter()
            .map(span)
            .fold((usize::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)))
    };
    above(envelope(dst), envelope(src))
}

trait AtomicWord {
    fn fetch_add(&self, v: u64) -> u64;
    fn cmpxchg(&self, expected: u64, new: u64) -> Result<u64, u64>;
    fn swap(&self, v: u64) -> u64;
}

impl AtomicWord for AtomicU64 {
    fn fetch_add(&self, v: u64) -> u64 {
        AtomicU64::fetch_add(self, v, Ordering::SeqCst)
    }
    fn cmpxchg(&self, expected: u64, new: u64) -> Result<u64, u64> {
        self.compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst)
    }
    fn swap(&self, v: u64) -> u64 {
        AtomicU64::swap(self, v, Ordering::SeqCst)
    }
}

struct Atomic32<'a>(&'a AtomicU32);

impl AtomicWord for Atomic32<'_> {
    fn fetch_add(&self, v: u64) -> u64 {
        self.0.fetch_add(v as u32, Ordering::SeqCst) as u64
    }
    fn cmpxchg(&self, expected: u64, new: u64) -> Result<u64, u64> {
        self.0
            .compare_exchange(
                expected as u32,
                new as u32,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .map(u64::from)
            .map_err(u64::from)
    }
    fn swap(&self, v: u64) -> u64 {
        self.0.swap(v as u32, Ordering::SeqCst) as u64
    }
}

/// Runs `a` (`repeat` times for FETCH_ADD): (old value of the last operation, operations).
fn apply<W: AtomicWord>(
    w: &W,
    a: &Atomic,
    repeat: u64,
    cancel: &AtomicBool,
) -> Result<(u64, u64), Status> {
    Ok(match a.op {
        ATOMIC_FETCH_ADD => {
            let mut old = 0;
            for i in 0..repeat {
                if i % ATOMIC_STEP == 0 && cancel.load(Ordering::Relaxed) {
                    return Err(Status::Interrupted);
                }
                old = w.fetch_add(a.operand);
            }
            (old, repeat)
        }
        ATOMIC_CMPXCHG => match w.cmpxchg(a.compare, a.operand) {
            Ok(old) => (old, 1),
            Err(cur) => (cur, 0),
        },
        ATOMIC_SWAP => (w.swap(a.operand), 1),
        _ => (0, 0),
    })
}

#[cfg(test)]
mod tests {
    /// CHECKSUM's contract with the driver (and tests/guest's C copy): CRC-32C with the
    /// request's seed as the CRC of what came before.
    #[test]
    fn crc32c_known_vectors_and_seeds() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c::crc32c_append(0, b""), 0);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let (a, b) = data.split_at(3333);
        assert_eq!(
            crc32c::crc32c_append(crc32c::crc32c_append(5, a), b),
            crc32c::crc32c_append(5, &data)
        );
    }
}
