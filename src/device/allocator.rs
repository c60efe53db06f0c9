// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Device-memory allocator: buffers with stable identifiers, first fit, coalescing free list.

use std::collections::BTreeMap;

pub const GRANULE: u64 = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub id: u64,
    pub offset: u64,
    pub size: u64,
    pub uuid: Option<[u8; 16]>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum AllocError {
    /// Size zero, or alignment not a power of two.
    Invalid,
    NoSpace,
    NotFound,
    Exists,
}

/// Why a set of buffers cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("buffer {0} wraps around")]
    Wraps(u64),
    #[error("buffer {} ({} bytes at {:#x}) is not a valid allocation", .0.id, .0.size, .0.offset)]
    Invalid(Buffer),
    #[error("buffer {0} appears twice")]
    Twice(u64),
}

pub struct Allocator {
    size: u64,
    /// offset -> length of each free extent; extents never touch (they are merged).
    free: BTreeMap<u64, u64>,
    buffers: BTreeMap<u64, Buffer>,
    next_id: u64,
}

impl Allocator {
    pub fn new(size: u64) -> Allocator {
        let size = size - size % GRANULE;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Allocator {
            size,
            free,
            buffers: BTreeMap::new(),
            next_id: 1,
        }
    }

    /// Rebuilds an allocator from saved buffers, refusing any that overlap or lie outside
    /// `size` (a corrupt or foreign state file).
    pub fn restore(
        size: u64,
        next_id: u64,
        buffers: Vec<Buffer>,
    ) -> Result<Allocator, RestoreError> {
        let mut a = Allocator::new(size);
        let mut by_offset: Vec<&Buffer> = buffers.iter().collect();
        by_offset.sort_by_key(|b| b.offset);
        let mut cursor = 0u64;
        a.free.clear();
        for b in by_offset {
            let end = b
                .offset
                .checked_add(b.size)
                .ok_or(RestoreError::Wraps(b.id))?;
            if b.size == 0
                || b.offset % GRANULE != 0
                || b.size % GRANULE != 0
                || b.offset < cursor
                || end > a.size
                || b.id == 0
                || b.id >= next_id
            {
                return Err(RestoreError::Invalid(b.clone()));
            }
            if b.offset > cursor {
                a.free.insert(cursor, b.offset - cursor);
            }
            cursor = end;
            if a.buffers.insert(b.id, b.clone()).is_some() {
                return Err(RestoreError::Twice(b.id));
            }
        }
        if a.size > cursor {
            a.free.insert(cursor, a.size - cursor);
        }
        // Every buffer's id is below next_id (checked above); 0 is no id.
        a.next_id = next_id.max(1);
        Ok(a)
    }

    /// The identifier the next allocation gets.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    pub fn alloc(&mut self, size: u64, align: u64) -> Result<Buffer, AllocError> {
        self.alloc_avoiding(size, align, |_, _| None)
    }

    /// First fit that leaves out what `avoid` refuses: `avoid(offset, size)` answers the
    /// end of the refused part of that placement (poisoned memory), and the search goes
    /// on from there, in the same free extent and the ones after it.
    pub fn alloc_avoiding(
        &mut self,
        size: u64,
        align: u64,
        avoid: impl Fn(u64, u64) -> Option<u64>,
    ) -> Result<Buffer, AllocError> {
        let align = if align == 0 { GRANULE } else { align };
        if size == 0 || !align.is_power_of_two() || align > self.size.max(GRANULE) {
            return Err(AllocError::Invalid);
        }
        let align = align.max(GRANULE);
        let size = size.checked_add(GRANULE - 1).ok_or(AllocError::NoSpace)? / GRANULE * GRANULE;
        let mut found = None;
        'extents: for (&start, &len) in &self.free {
            let mut from = start;
            while let Some(aligned) = from.div_ceil(align).checked_mul(align) {
                if aligned
                    .checked_add(size)
                    .is_none_or(|end| end > start + len)
                {
                    break;
                }
                match avoid(aligned, size) {
                    None => {
                        found = Some((start, len, aligned));
                        break 'extents;
                    }
                    Some(refused_end) if refused_end > aligned => from = refused_end,
                    // No progress: leave this extent rather than loop.
                    Some(_) => break,
                }
            }
        }
        let (start, len, aligned) = found.ok_or(AllocError::NoSpace)?;
        let next_id = self.next_id.checked_add(1).ok_or(AllocError::NoSpace)?;
        self.free.remove(&start);
        if aligned > start {
            self.free.insert(start, aligned - start);
        }
        let end = aligned + size;
        if start + len > end {
            self.free.insert(end, start + len - end);
        }
        let buf = Buffer {
            id: self.next_id,
            offset: aligned,
            size,
            uuid: None,
        };
        self.next_id = next_id;
        self.buffers.insert(buf.id, buf.clone());
        Ok(buf)
    }

    pub fn free(&mut self, id: u64) -> Result<Buffer, AllocError> {
        let buf = self.buffers.remove(&id).ok_or(AllocError::NotFound)?;
        let mut start = buf.offset;
        let mut len = buf.size;
        if let Some((&prev, &plen)) = self.free.range(..start).next_back() {
            if prev + plen == start {
                self.free.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nlen;
        }
        self.free.insert(start, len);
        Ok(buf)
    }

    pub fn buffers(&self) -> impl Iterator<Item = &Buffer> {
        self.buffers.values()
    }

    pub fn set_uuid(&mut self, id: u64, uuid: [u8; 16]) -> Result<(), AllocError> {
        if self.buffers.values().any(|b| b.uuid == Some(uuid)) {
            return Err(AllocError::Exists);
        }
        let buf = self.buffers.get_mut(&id).ok_or(AllocError::NotFound)?;
        if buf.uuid.is_some() {
            return Err(AllocError::Exists);
        }
        buf.uuid = Some(uuid);
        Ok(())
    }

    pub fn clear_uuid(&mut self, uuid: [u8; 16]) -> Result<u64, AllocError> {
        let buf = self
            .buffers
            .values_mut()
            .find(|b| b.uuid == Some(uuid))
            .ok_or(AllocError::NotFound)?;
        buf.uuid = None;
        Ok(buf.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restored_ids_start_at_one_and_never_wrap() {
        let a = Allocator::restore(64 * GRANULE, 0, Vec::new()).unwrap();
        assert_eq!(a.next_id(), 1);
        // An identifier space used up is NO_SPACE, not a wrap to 0.
        let mut a = Allocator::restore(64 * GRANULE, u64::MAX, Vec::new()).unwrap();
        assert!(matches!(a.alloc(GRANULE, 0), Err(AllocError::NoSpace)));
        assert_eq!(a.free_bytes(), 64 * GRANULE);
        assert!(a.is_empty());
    }

    #[test]
    fn alloc_avoiding_goes_past_refused_ranges() {
        const K: u64 = 1024;
        let mut a = Allocator::new(1 << 20);
        let bad = [(0, 600 * K), (640 * K, 644 * K)];
        let avoid = |o: u64, n: u64| {
            bad.iter()
                .filter(|&&(s, e)| s < o + n && e > o)
                .map(|&(_, e)| e)
                .max()
        };
        // Past the first range, then past the second, in the same free extent.
        let b = a.alloc_avoiding(64 * K, 0, avoid).unwrap();
        assert_eq!(b.offset, 644 * K);
        // Aligned: the gap left before the buffer is refused too; the next extent fits.
        let c = a.alloc_avoiding(4 * K, 64 * K, avoid).unwrap();
        assert_eq!(c.offset, 768 * K);
        // Nothing fits outside them: NO_SPACE, and nothing changed.
        let before = a.free_bytes();
        assert!(matches!(
            a.alloc_avoiding(512 * K, 0, avoid),
            Err(AllocError::NoSpace)
        ));
        assert_eq!((a.free_bytes(), a.len()), (before, 2));
    }

    /// A 1 MiB allocator holding three buffers of these sizes, the last 64 KiB-aligned.
    fn three(sizes: [u64; 3]) -> (Allocator, [Buffer; 3]) {
        let mut a = Allocator::new(1 << 20);
        let b1 = a.alloc(sizes[0], 0).unwrap();
        let b2 = a.alloc(sizes[1], 0).unwrap();
        let b3 = a.alloc(sizes[2], 65536).unwrap();
        (a, [b1, b2, b3])
    }

    #[test]
    fn alloc_free_coalesces_back_to_one_extent() {
        let (mut a, [b1, b2, b3]) = three([4096, 10000, 65536]);
        assert_eq!(b2.size, 12288);
        assert_eq!(b3.offset % 65536, 0);
        assert_eq!(a.len(), 3);
        a.free(b2.id).unwrap();
        a.free(b1.id).unwrap();
        a.free(b3.id).unwrap();
        assert_eq!(a.free_bytes(), 1 << 20);
        assert_eq!(a.free.len(), 1);
    }

    #[test]
    fn exhaustion_and_fragmentation() {
        let mut a = Allocator::new(64 * 4096);
        let bufs: Vec<_> = (0..64).map(|_| a.alloc(4096, 0).unwrap()).collect();
        assert_eq!(a.alloc(4096, 0), Err(AllocError::NoSpace));
        for b in bufs.iter().step_by(2) {
            a.free(b.id).unwrap();
        }
        assert_eq!(a.free_bytes(), 32 * 4096);
        // Free space is fragmented into single pages: a two-page buffer does not fit.
        assert_eq!(a.alloc(8192, 0), Err(AllocError::NoSpace));
        assert!(a.alloc(4096, 0).is_ok());
    }

    #[test]
    fn restore_rebuilds_free_space_and_refuses_overlaps() {
        let (mut a, [b1, b2, b3]) = three([8192, 4096, 65536]);
        a.free(b2.id).unwrap();
        let saved: Vec<Buffer> = a.buffers().cloned().collect();
        let mut r = Allocator::restore(1 << 20, a.next_id(), saved.clone()).unwrap();
        assert_eq!(r.free_bytes(), a.free_bytes());
        assert_eq!(r.free, a.free);
        assert_eq!(r.alloc(4096, 0).unwrap().id, 4);
        r.free(b1.id).unwrap();
        r.free(b3.id).unwrap();
        let mut overlapping = saved.clone();
        overlapping[1].offset = overlapping[0].offset + 4096;
        assert!(Allocator::restore(1 << 20, 4, overlapping).is_err());
        let mut outside = saved.clone();
        outside[1].offset = 1 << 20;
        assert!(Allocator::restore(1 << 20, 4, outside).is_err());
        assert!(
            Allocator::restore(1 << 20, 2, saved).is_err(),
            "id beyond next_id"
        );
    }

    #[test]
    fn rejects_bad_arguments_and_unknown_ids() {
        let mut a = Allocator::new(1 << 20);
        assert_eq!(a.alloc(0, 0), Err(AllocError::Invalid));
        assert_eq!(a.alloc(4096, 3), Err(AllocError::Invalid));
        assert_eq!(a.alloc(u64::MAX, 0), Err(AllocError::NoSpace));
        assert_eq!(a.free(42), Err(AllocError::NotFound));
        let b = a.alloc(4096, 0).unwrap();
        a.set_uuid(b.id, [1; 16]).unwrap();
        assert_eq!(a.set_uuid(b.id, [2; 16]), Err(AllocError::Exists));
        assert_eq!(a.clear_uuid([1; 16]), Ok(b.id));
        assert_eq!(a.clear_uuid([1; 16]), Err(AllocError::NotFound));
    }
}
