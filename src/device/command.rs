// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Decoding and structural validation of command-queue requests.
//!
//! Everything here works on the bytes of a request; nothing touches memory. Address ranges
//! are checked later, when they are resolved against guest and device memory.

use vm_memory::ByteValued;

use crate::protocol::*;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Nop,
    Identify,
    Stats,
    Reset,
    Fence,
    SetDevmemBase {
        gpa: u64,
    },
    Copy {
        src: Vec<Sge>,
        dst: Vec<Sge>,
    },
    Fill {
        pattern: u64,
        dst: Vec<Sge>,
    },
    Checksum {
        seed: u32,
        src: Vec<Sge>,
    },
    Atomic(Atomic),
    CopyPages {
        page_size: u32,
        src_space: u16,
        dst_space: u16,
        src: Vec<u64>,
        dst: Vec<u64>,
    },
    Signal {
        value: u64,
    },
    Alloc {
        size: u64,
        align: u64,
    },
    Free {
        id: u64,
    },
    Export {
        id: u64,
        uuid: [u8; 16],
    },
    Unexport {
        uuid: [u8; 16],
    },
}

pub const MIN_PAGE_SIZE: u32 = 4096;
pub const MAX_PAGE_SIZE: u32 = 2 << 20;

/// A request's header, read once when the request arrives and passed on with it: for
/// ordering (fences), for the tag its answer echoes, and to decode the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub opcode: u16,
    pub flags: u16,
    /// 0 unless the header is whole.
    pub tag: u64,
    /// The whole header was there. A shorter request keeps whatever opcode and flags bytes
    /// it has (for ordering and error events) but its answer names no opcode or tag.
    pub whole: bool,
}

impl Header {
    pub fn read(bytes: &[u8]) -> Header {
        let word = |i: usize| {
            bytes
                .get(i..i + 2)
                .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]))
        };
        let mut h = Header {
            opcode: word(0),
            flags: word(2),
            ..Default::default()
        };
        if let Some(b) = bytes.get(..std::mem::size_of::<CmdHdr>()) {
            let mut whole = CmdHdr::default();
            whole.as_mut_slice().copy_from_slice(b);
            h.tag = whole.tag;
            h.whole = true;
        }
        h
    }

    /// The opcode an answer names: none for a cut-short header.
    pub fn answered_opcode(&self) -> u16 {
        if self.whole {
            self.opcode
        } else {
            0
        }
    }

    /// Waits for everything submitted before it (FENCE itself does, as the flag does).
    pub fn fenced(&self) -> bool {
        self.flags & FLAG_FENCE != 0 || self.opcode == OP_FENCE
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub hdr: Header,
    pub cmd: Command,
}

/// A decoding failure: the status, the segment index or 0, and what we know of the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub opcode: u16,
    pub tag: u64,
    pub status: Status,
    pub detail: u32,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn read<T: ByteValued + Default>(&mut self) -> Result<T, Status> {
        let n = std::mem::size_of::<T>();
        let bytes = self
            .buf
            .get(self.pos..self.pos.checked_add(n).ok_or(Status::Truncated)?)
            .ok_or(Status::Truncated)?;
        let mut v = T::default();
        v.as_mut_slice().copy_from_slice(bytes);
        self.pos += n;
        Ok(v)
    }

    fn sges(&mut self, n: u32) -> Result<Vec<Sge>, Status> {
        if n > MAX_SEGMENTS {
            return Err(Status::TooLarge);
        }
        let mut total = 0u64;
        self.need(n as usize * std::mem::size_of::<Sge>())?;
        let mut v = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let s: Sge = self.read()?;
            if s.space != SPACE_GPA && s.space != SPACE_DEVMEM {
                return Err(Status::Invalid);
            }
            total += s.len as u64;
            if total > MAX_TRANSFER {
                return Err(Status::TooLarge);
            }
            v.push(s);
        }
        Ok(v)
    }

    /// A list of `n` segments that may not be empty.
    fn some_sges(&mut self, n: u32) -> Result<Vec<Sge>, Status> {
        if n == 0 {
            return Err(Status::Invalid);
        }
        self.sges(n)
    }

    fn addrs(&mut self, n: u32) -> Result<Vec<u64>, Status> {
        self.need(n as usize * 8)?;
        (0..n).map(|_| self.read::<u64>()).collect()
    }

    /// Fails early on a short request, before allocating for its declared contents.
    fn need(&self, n: usize) -> Result<(), Status> {
        if self.buf.len().saturating_sub(self.pos) < n {
            Err(Status::Truncated)
        } else {
            Ok(())
        }
    }
}

/// At most how many bytes a request moves, read from its bytes without decoding them (no
/// allocation): what decides whether it runs where it arrives or on a DMA engine. A
/// request too short to say moves nothing (it fails at once).
pub fn bytes_moved(hdr: Header, bytes: &[u8]) -> u64 {
    let u32_at = |i: usize| {
        bytes
            .get(i..i + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |i: usize| u32_at(i) as u64 | (u32_at(i + 4) as u64) << 32;
    // The lengths of `n` scatter-gather entries from `at` (len is at +8 in each).
    let sges = |at: usize, n: u32| -> u64 {
        let size = std::mem::size_of::<Sge>();
        (0..n.min(MAX_SEGMENTS) as usize)
            .map(|i| u32_at(at + i * size + 8) as u64)
            .sum()
    };
    let p = std::mem::size_of::<CmdHdr>();
    match hdr.opcode {
        OP_COPY => sges(p + std::mem::size_of::<Copy>(), u32_at(p)),
        OP_FILL => sges(p + std::mem::size_of::<Fill>(), u32_at(p + 8)),
        OP_CHECKSUM => sges(p + std::mem::size_of::<Checksum>(), u32_at(p)),
        // Each repetition reads and writes the word.
        OP_ATOMIC => u64_at(p + 32).max(1).saturating_mul(16),
        OP_COPY_PAGES => (u32_at(p) as u64).saturating_mul(u32_at(p + 4) as u64),
        _ => 0,
    }
}

fn valid_space(space: u16) -> Result<(), Status> {
    if space == SPACE_GPA || space == SPACE_DEVMEM {
        Ok(())
    } else {
        Err(Status::Invalid)
    }
}

pub fn decode(bytes: &[u8]) -> Result<Request, DecodeError> {
    decode_with(Header::read(bytes), bytes)
}

/// Decodes a request whose header `hdr` was read from `bytes` already.
pub fn decode_with(hdr: Header, bytes: &[u8]) -> Result<Request, DecodeError> {
    let err = |status| DecodeError {
        opcode: hdr.answered_opcode(),
        tag: hdr.tag,
        status,
        detail: 0,
    };
    if !hdr.whole {
        return Err(err(Status::Truncated));
    }
    let mut c = Cursor {
        buf: bytes,
        pos: std::mem::size_of::<CmdHdr>(),
    };
    let cmd = decode_payload(hdr.opcode, &mut c).map_err(err)?;
    Ok(Request { hdr, cmd })
}

fn decode_payload(opcode: u16, c: &mut Cursor) -> Result<Command, Status> {
    Ok(match opcode {
        OP_NOP => Command::Nop,
        OP_IDENTIFY => Command::Identify,
        OP_STATS => Command::Stats,
        OP_RESET => Command::Reset,
        OP_FENCE => Command::Fence,
        OP_SET_DEVMEM_BASE => Command::SetDevmemBase {
            gpa: c.read::<SetDevmemBase>()?.gpa,
        },
        OP_COPY => {
            let p: Copy = c.read()?;
            if p.nr_src == 0 || p.nr_dst == 0 {
                return Err(Status::Invalid);
            }
            let src = c.sges(p.nr_src)?;
            let dst = c.sges(p.nr_dst)?;
            let total = |l: &[Sge]| l.iter().map(|s| s.len as u64).sum::<u64>();
            if total(&src) != total(&dst) {
                return Err(Status::LengthMismatch);
            }
            Command::Copy { src, dst }
        }
        OP_FILL => {
            let p: Fill = c.read()?;
            Command::Fill {
                pattern: p.pattern,
                dst: c.some_sges(p.nr_dst)?,
            }
        }
        OP_CHECKSUM => {
            let p: Checksum = c.read()?;
            Command::Checksum {
                seed: p.seed,
                src: c.some_sges(p.nr_src)?,
            }
        }
        OP_ATOMIC => {
            let p: Atomic = c.read()?;
            valid_space(p.space)?;
            if p.width != 4 && p.width != 8 {
                return Err(Status::Invalid);
            }
            if !p.addr.is_multiple_of(p.width as u64) {
                return Err(Status::Unaligned);
            }
            match p.op {
                ATOMIC_FETCH_ADD => {
                    if p.repeat == 0 || p.repeat > MAX_ATOMIC_REPEAT {
                        return Err(Status::Invalid);
                    }
                }
                ATOMIC_CMPXCHG | ATOMIC_SWAP => {
                    if p.repeat > 1 {
                        return Err(Status::Invalid);
                    }
                }
                _ => return Err(Status::Invalid),
            }
            Command::Atomic(p)
        }
        OP_COPY_PAGES => {
            let p: CopyPages = c.read()?;
            valid_space(p.src_space)?;
            valid_space(p.dst_space)?;
            if !p.page_size.is_power_of_two()
                || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&p.page_size)
            {
                return Err(Status::Invalid);
            }
            if p.nr_pages == 0 {
                return Err(Status::Invalid);
            }
            if p.nr_pages > MAX_PAGES || p.nr_pages as u64 * p.page_size as u64 > MAX_TRANSFER {
                return Err(Status::TooLarge);
            }
            let src = c.addrs(p.nr_pages)?;
            let dst = c.addrs(p.nr_pages)?;
            Command::CopyPages {
                page_size: p.page_size,
                src_space: p.src_space,
                dst_space: p.dst_space,
                src,
                dst,
            }
        }
        OP_SIGNAL => Command::Signal {
            value: c.read::<Signal>()?.value,
        },
        OP_FREE => Command::Free {
            id: c.read::<Free>()?.id,
        },
        OP_ALLOC => {
            let Alloc { size, align } = c.read()?;
            Command::Alloc { size, align }
        }
        OP_EXPORT => {
            let Export { id, uuid } = c.read()?;
            Command::Export { id, uuid }
        }
        OP_UNEXPORT => Command::Unexport {
            uuid: c.read::<Unexport>()?.uuid,
        },
        _ => return Err(Status::Unsupported),
    })
}

/// Encoding helpers, used by tests, benchmarks and any Rust front-end.
pub mod encode {
    use super::*;

    pub fn hdr(opcode: u16, flags: u16, tag: u64) -> Vec<u8> {
        CmdHdr {
            opcode,
            flags,
            reserved: 0,
            tag,
        }
        .as_slice()
        .to_vec()
    }

    pub fn sge(space: u16, addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            len,
            space,
            reserved: 0,
        }
    }

    pub fn with<T: ByteValued>(mut v: Vec<u8>, payload: &T) -> Vec<u8> {
        v.extend_from_slice(payload.as_slice());
        v
    }

    pub fn sges(mut v: Vec<u8>, list: &[Sge]) -> Vec<u8> {
        for s in list {
            v.extend_from_slice(s.as_slice());
        }
        v
    }

    pub fn copy(tag: u64, src: &[Sge], dst: &[Sge]) -> Vec<u8> {
        let p = Copy {
            nr_src: src.len() as u32,
            nr_dst: dst.len() as u32,
        };
        sges(sges(with(hdr(OP_COPY, 0, tag), &p), src), dst)
    }

    pub fn fill(tag: u64, pattern: u64, dst: &[Sge]) -> Vec<u8> {
        let p = Fill {
            pattern,
            nr_dst: dst.len() as u32,
            reserved: 0,
        };
        sges(with(hdr(OP_FILL, 0, tag), &p), dst)
    }

    pub fn checksum(tag: u64, seed: u32, src: &[Sge]) -> Vec<u8> {
        let p = Checksum {
            nr_src: src.len() as u32,
            seed,
        };
        sges(with(hdr(OP_CHECKSUM, 0, tag), &p), src)
    }

    pub fn atomic(tag: u64, a: Atomic) -> Vec<u8> {
        with(hdr(OP_ATOMIC, 0, tag), &a)
    }

    pub fn copy_pages(
        tag: u64,
        page_size: u32,
        src_space: u16,
        dst_space: u16,
        src: &[u64],
        dst: &[u64],
    ) -> Vec<u8> {
        let p = CopyPages {
            nr_pages: src.len() as u32,
            page_size,
            src_space,
            dst_space,
            reserved: 0,
        };
        let mut v = with(hdr(OP_COPY_PAGES, 0, tag), &p);
        for a in src.iter().chain(dst) {
            v.extend_from_slice(&a.to_le_bytes());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::encode::*;
    use super::*;

    fn status(bytes: &[u8]) -> Status {
        decode(bytes).unwrap_err().status
    }

    #[test]
    fn decodes_every_opcode() {
        let s = sge(SPACE_DEVMEM, 0, 8);
        let r = decode(&copy(7, &[s], &[s])).unwrap();
        assert_eq!(r.hdr.tag, 7);
        assert!(matches!(r.cmd, Command::Copy { .. }));
        assert!(matches!(
            decode(&fill(1, 5, &[s])).unwrap().cmd,
            Command::Fill { pattern: 5, .. }
        ));
        assert!(matches!(
            decode(&checksum(1, 9, &[s])).unwrap().cmd,
            Command::Checksum { seed: 9, .. }
        ));
        for op in [OP_NOP, OP_IDENTIFY, OP_STATS, OP_FENCE] {
            assert_eq!(decode(&hdr(op, 0, 0)).unwrap().hdr.opcode, op);
        }
    }

    #[test]
    fn truncated_requests() {
        assert_eq!(status(&[0u8; 15]), Status::Truncated);
        let s = sge(SPACE_DEVMEM, 0, 8);
        let full = copy(1, &[s], &[s]);
        for cut in 16..full.len() {
            assert_eq!(status(&full[..cut]), Status::Truncated, "cut at {cut}");
        }
        assert_eq!(status(&hdr(OP_ALLOC, 0, 0)), Status::Truncated);
    }

    #[test]
    fn a_cut_short_header_keeps_opcode_and_flags_but_names_nothing() {
        let full = hdr(OP_FENCE, FLAG_FENCE, 5);
        let h = Header::read(&full[..4]);
        assert_eq!(
            (h.opcode, h.flags, h.tag, h.whole),
            (OP_FENCE, FLAG_FENCE, 0, false)
        );
        assert!(h.fenced());
        assert_eq!(h.answered_opcode(), 0);
        assert_eq!(Header::read(&full[..1]), Header::default());
        let h = Header::read(&full);
        assert_eq!((h.answered_opcode(), h.tag, h.whole), (OP_FENCE, 5, true));
    }

    #[test]
    fn unknown_opcode_keeps_tag() {
        let e = decode(&hdr(0x7777, 0, 99)).unwrap_err();
        assert_eq!(
            (e.status, e.tag, e.opcode),
            (Status::Unsupported, 99, 0x7777)
        );
    }

    #[test]
    fn structural_errors() {
        let s = sge(SPACE_DEVMEM, 0, 8);
        let bad_space = sge(9, 0, 8);
        assert_eq!(status(&copy(1, &[bad_space], &[s])), Status::Invalid);
        assert_eq!(
            status(&copy(1, &[s], &[sge(SPACE_DEVMEM, 0, 9)])),
            Status::LengthMismatch
        );
        assert_eq!(status(&copy(1, &[], &[])), Status::Invalid);
        // A huge declared count with no data behind it is rejected without allocating.
        let mut v = hdr(OP_COPY, 0, 1);
        v.extend_from_slice(&u32::MAX.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(status(&v), Status::TooLarge);
        let a = |op, width, addr, repeat| Atomic {
            op,
            width,
            space: SPACE_DEVMEM,
            reserved: 0,
            addr,
            operand: 1,
            compare: 0,
            repeat,
        };
        assert_eq!(
            status(&atomic(1, a(ATOMIC_FETCH_ADD, 8, 4, 1))),
            Status::Unaligned
        );
        assert_eq!(
            status(&atomic(1, a(ATOMIC_FETCH_ADD, 2, 0, 1))),
            Status::Invalid
        );
        assert_eq!(
            status(&atomic(1, a(ATOMIC_FETCH_ADD, 8, 0, 0))),
            Status::Invalid
        );
        assert_eq!(status(&atomic(1, a(9, 8, 0, 1))), Status::Invalid);
        assert_eq!(
            status(&atomic(1, a(ATOMIC_FETCH_ADD, 8, 0, MAX_ATOMIC_REPEAT + 1))),
            Status::Invalid
        );
        // The same range listed many times cannot make one command move terabytes.
        let big = sge(SPACE_DEVMEM, 0, u32::MAX);
        assert_eq!(status(&fill(1, 0, &[big; 2])), Status::TooLarge);
        assert_eq!(
            status(&atomic(1, a(ATOMIC_CMPXCHG, 8, 0, 5))),
            Status::Invalid
        );
        assert_eq!(
            status(&copy_pages(1, 4097, SPACE_GPA, SPACE_DEVMEM, &[0], &[0])),
            Status::Invalid
        );
    }
}
