// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Command execution: a request decoded (its header read once, when it arrived) and run
//! against guest memory, device memory and the allocator, with its state changes logged.

use vm_memory::{ByteValued, GuestMemoryMmap};

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::state::Origin;
use super::{sleep_unless, traffic, Attach, Device, Reply};
use crate::device::allocator::{AllocError, Allocator};
use crate::device::command::{decode_with, Command, Header, Request};
use crate::device::engine::{Ctx, Moved};
use crate::device::faults::Action;
use crate::device::state::Mutation;
use crate::protocol::*;

/// What [`Device::admit`] decided for a request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Admission {
    /// The injected fault it meets, if any.
    pub fault: Option<Action>,
    /// Whether it runs on the thread that took it, as it arrives: small, unfenced, no
    /// state change (ALLOC, FREE, EXPORT, UNEXPORT and RESET write the state file and
    /// queue behind the engines' work), and nothing (an injected fault, a stalled engine,
    /// the latency model) would make it wait there.
    pub inline: bool,
}

impl Device {
    /// In NUMA mode the guest kernel allocates the memory: buffers and device offsets
    /// would alias pages it hands out.
    fn refuses(&self, cmd: &Command) -> bool {
        if self.cfg.attach != Attach::Numa {
            return false;
        }
        let devmem = |l: &[Sge]| l.iter().any(|s| s.space == SPACE_DEVMEM);
        match cmd {
            Command::Alloc { .. } | Command::Export { .. } => true,
            Command::Copy { src, dst } => devmem(src) || devmem(dst),
            Command::Fill { dst, .. } => devmem(dst),
            Command::Checksum { src, .. } => devmem(src),
            Command::Atomic(a) => a.space == SPACE_DEVMEM,
            Command::CopyPages {
                src_space,
                dst_space,
                ..
            } => *src_space == SPACE_DEVMEM || *dst_space == SPACE_DEVMEM,
            _ => false,
        }
    }

    /// Decides, once per request and in the order requests arrive, what happens to it
    /// before it runs: the injected fault it meets, and whether it may run on the thread
    /// that took it (see [`Admission::inline`]). `malformed`: the request is answered with
    /// an error and never runs.
    pub fn admit(&self, hdr: Header, bytes: &[u8], malformed: bool) -> Admission {
        if malformed {
            return Admission::default();
        }
        let fault = self.faults.decide(hdr.opcode);
        let max = self.cfg.inline_max;
        let inline = max > 0
            && fault.is_none()
            && !hdr.fenced()
            && !matches!(
                hdr.opcode,
                OP_ALLOC | OP_FREE | OP_EXPORT | OP_UNEXPORT | OP_RESET
            )
            && !self.faults.stalled()
            && !self.faults.model().enforce
            && crate::device::command::bytes_moved(hdr, bytes) <= max;
        Admission { fault, inline }
    }

    /// Decodes and executes one request outside any queue (tests, fuzzing): admitted
    /// here, never cancelled, logged with no origin.
    pub fn execute(&self, guest: &GuestMemoryMmap, bytes: &[u8]) -> Reply {
        let hdr = Header::read(bytes);
        let admission = self.admit(hdr, bytes, false);
        self.execute_admitted(
            guest,
            hdr,
            bytes,
            None,
            &crate::device::engine::NEVER,
            admission.fault,
        )
    }

    /// Executes an admitted request: `hdr` was read from `bytes` when it arrived and
    /// `fault` decided then ([`Device::admit`]); `origin` ties a state change to the
    /// request in the journal, so a restarted daemon can still give its answer. Cut short
    /// with `INTERRUPTED` when `cancel` is set (the front-end stops the queue): only data
    /// commands (COPY, FILL, CHECKSUM, COPY_PAGES, repeated ATOMIC) stop part-way, which
    /// leaves their destination undefined as the status says; state changes are not
    /// interruptible and complete or do not start.
    pub fn execute_admitted(
        &self,
        guest: &GuestMemoryMmap,
        hdr: Header,
        bytes: &[u8],
        origin: Option<Origin>,
        cancel: &std::sync::atomic::AtomicBool,
        fault: Option<Action>,
    ) -> Reply {
        self.add_stat(STAT_COMMANDS, 1);
        self.metrics.started();
        let start = Instant::now();
        let cancelled = || cancel.load(Ordering::Relaxed);
        let mut reply = match decode_with(hdr, bytes) {
            Ok(req) => {
                let mut reply = Reply {
                    opcode: req.hdr.opcode,
                    ..Default::default()
                };
                reply.resp.tag = req.hdr.tag;
                match fault {
                    _ if !self.faults.wait_unstalled(&cancelled) => {
                        reply.resp.status = Status::Interrupted as u32;
                    }
                    Some(Action::Fail(status)) => reply.resp.status = status as u32,
                    Some(Action::Skip) => {
                        // OK, and for the data movers the count a complete command reports.
                        reply.resp.status = Status::Ok as u32;
                        reply.resp.result0 = match &req.cmd {
                            Command::Copy { src, .. } => src.iter().map(|s| s.len as u64).sum(),
                            Command::Fill { dst, .. } => dst.iter().map(|s| s.len as u64).sum(),
                            Command::CopyPages { src, .. } => src.len() as u64,
                            _ => 0,
                        };
                    }
                    Some(Action::Hang) => {
                        // Never answered while the queue runs; a queue stop ends it.
                        while !sleep_unless(Duration::from_secs(3600), &cancelled) {}
                        reply.resp.status = Status::Interrupted as u32;
                    }
                    fault => {
                        self.run(guest, &req, &mut reply, origin, cancel);
                        let wait = match fault {
                            Some(Action::Delay { min, .. }) => min,
                            Some(Action::Late { after }) => after,
                            _ => Duration::ZERO,
                        };
                        let page_size = match &req.cmd {
                            Command::CopyPages { page_size, .. } => *page_size,
                            _ => 0,
                        };
                        let (read, written) = traffic(req.hdr.opcode, &reply.resp, page_size);
                        let cost = self.faults.model().cost(read, written);
                        sleep_unless(wait + cost.saturating_sub(start.elapsed()), &cancelled);
                        match fault {
                            Some(Action::CorruptStatus) => {
                                reply.resp.status = crate::device::faults::UNDEFINED_STATUS
                            }
                            Some(Action::CorruptLength) => reply.corrupt_length = true,
                            _ => {}
                        }
                    }
                }
                reply
            }
            Err(e) => {
                let mut reply = Reply {
                    opcode: e.opcode,
                    ..Default::default()
                };
                reply.resp.tag = e.tag;
                reply.resp.status = e.status as u32;
                reply.resp.detail = e.detail;
                reply
            }
        };
        let took = start.elapsed();
        self.metrics.record(reply.opcode, reply.resp.status, took);
        let name = Status::from_u32(reply.resp.status).map_or("?", |s| s.name());
        if self.tracing() {
            log::info!(
                "trace: {} tag {} request {} bytes: {} (detail {}, result {} {}) in {} us",
                opcode_name(reply.opcode).unwrap_or("?"),
                reply.resp.tag,
                bytes.len(),
                name,
                reply.resp.detail,
                reply.resp.result0,
                reply.resp.result1,
                took.as_micros()
            );
        }
        if reply.resp.status != Status::Ok as u32 {
            self.add_stat(STAT_ERRORS, 1);
            self.errlog.warn(format_args!(
                "command {:#x} tag {} failed: {} (detail {})",
                reply.opcode, reply.resp.tag, name, reply.resp.detail
            ));
            reply.payload.clear();
        }
        reply
    }

    fn run(
        &self,
        guest: &GuestMemoryMmap,
        req: &Request,
        reply: &mut Reply,
        origin: Option<Origin>,
        cancel: &std::sync::atomic::AtomicBool,
    ) {
        let layout = self.layout();
        let ctx = Ctx {
            guest,
            devmem: &self.devmem,
            peers: &layout.peers,
            devmem_gpa: layout.devmem_gpa,
            cancel,
            faults: &self.faults,
            poisoned_at: std::cell::Cell::new(None),
        };
        self.run_in(&ctx, req, reply, origin);
        if reply.resp.status == Status::MediaError as u32 {
            // The detail names the first poisoned page the command met.
            let at = ctx.poisoned_at.get().unwrap_or(0);
            reply.resp.detail = u32::try_from(at / 4096).unwrap_or(u32::MAX);
            self.add_stat(STAT_MEDIA_ERRORS, 1);
        }
    }

    fn run_in(&self, ctx: &Ctx, req: &Request, reply: &mut Reply, origin: Option<Origin>) {
        let layout = self.layout();
        let r = &mut reply.resp;
        let mut fail = |status: Status, detail: u32| {
            r.status = status as u32;
            r.detail = detail;
        };
        if self.refuses(&req.cmd) {
            fail(Status::Unsupported, 0);
            return;
        }
        match &req.cmd {
            Command::Nop | Command::Fence => {}
            Command::Identify => {
                let alloc = self.alloc.lock();
                let (free, buffers) = alloc
                    .map(|a| (a.free_bytes(), a.len() as u32))
                    .unwrap_or((0, 0));
                let id = Identify {
                    magic: MAGIC,
                    version_major: VERSION_MAJOR,
                    version_minor: VERSION_MINOR,
                    features: self.features(),
                    devmem_size: self.devmem.size(),
                    devmem_gpa: layout.devmem_gpa.unwrap_or(0),
                    devmem_free: free,
                    num_dma_engines: self.cfg.dma_engines,
                    max_segments: MAX_SEGMENTS,
                    buffers,
                    device_index: self.cfg.index,
                    reserved: 0,
                };
                reply.payload = id.as_slice().to_vec();
            }
            Command::Stats => {
                let mut s = Stats::default();
                for (i, c) in s.counter.iter_mut().enumerate() {
                    *c = self.stat(i);
                }
                reply.payload = s.as_slice().to_vec();
            }
            Command::Reset => {
                // A driver starting afresh: whatever an earlier driver (or a crashed guest)
                // left allocated or undelivered is gone.
                if let Ok(mut a) = self.alloc.lock() {
                    r.result0 = a.len() as u64;
                    // Announced under the lock, so announcements keep the device's order.
                    for b in a.buffers() {
                        if let Some(uuid) = b.uuid {
                            self.notify_export(uuid, false);
                        }
                    }
                    *a = Allocator::new(self.devmem.size());
                    self.state.record(&a, Mutation::Reset, origin, r);
                }
                if let Ok(mut q) = self.events.lock() {
                    q.clear();
                }
                self.notes.log(
                    log::Level::Info,
                    format_args!("device reset by the driver: {} buffers released", r.result0),
                );
            }
            Command::SetDevmemBase { gpa } => match layout.devmem_gpa {
                None => fail(Status::NotReady, 0),
                Some(g) if g != *gpa => fail(Status::Invalid, 0),
                Some(_) => {}
            },
            Command::Copy { src, dst } => match ctx.copy(src, dst) {
                Ok(m) => {
                    self.account(STAT_BYTES_COPIED, m);
                    r.result0 = m.bytes;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Fill { pattern, dst } => match ctx.fill(*pattern, dst) {
                Ok(m) => {
                    self.account(STAT_BYTES_FILLED, m);
                    r.result0 = m.bytes;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Checksum { seed, src } => match ctx.checksum(*seed, src) {
                Ok((crc, m)) => {
                    self.account(STAT_BYTES_CHECKSUMMED, m);
                    r.result0 = crc as u64;
                    r.result1 = m.bytes;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Atomic(a) => match ctx.atomic(a) {
                Ok((old, n)) => {
                    self.add_stat(STAT_ATOMIC_OPS, n.max(1));
                    r.result0 = old;
                    r.result1 = n;
                }
                Err(s) => fail(s, 0),
            },
            Command::CopyPages {
                page_size,
                src_space,
                dst_space,
                src,
                dst,
            } => match ctx.copy_pages(*page_size, *src_space, *dst_space, src, dst) {
                Ok(m) => {
                    self.account(STAT_BYTES_COPIED, m);
                    self.add_stat(STAT_PAGES_COPIED, src.len() as u64);
                    r.result0 = src.len() as u64;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Signal { value } => {
                self.post_event(EVENT_SIGNAL, *value, req.hdr.tag);
            }
            Command::Alloc { size, align } => match self.alloc.lock() {
                Ok(mut a) => match self.alloc_unpoisoned(&mut a, *size, *align) {
                    Ok(b) => {
                        r.result0 = b.id;
                        r.result1 = b.offset;
                        let m = Mutation::alloc(&b);
                        self.state.record(&a, m, origin, r);
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
            // Export announcements are made under the allocator lock (they only queue a
            // message), so the front-end hears them in the order the device applied them.
            Command::Free { id } => match self.alloc.lock() {
                Ok(mut a) => match a.free(*id) {
                    Ok(b) => {
                        r.result0 = b.size;
                        self.state
                            .record(&a, Mutation::Free { id: b.id }, origin, r);
                        if let Some(uuid) = b.uuid {
                            self.notify_export(uuid, false);
                        }
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
            Command::Export { id, uuid } => match self.alloc.lock() {
                Ok(mut a) => match a.set_uuid(*id, *uuid) {
                    Ok(()) => {
                        let m = Mutation::Export {
                            id: *id,
                            uuid: *uuid,
                        };
                        self.state.record(&a, m, origin, r);
                        self.notify_export(*uuid, true);
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
            Command::Unexport { uuid } => match self.alloc.lock() {
                Ok(mut a) => match a.clear_uuid(*uuid) {
                    Ok(id) => {
                        r.result0 = id;
                        self.state.record(&a, Mutation::Unexport { id }, origin, r);
                        self.notify_export(*uuid, false);
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
        }
    }

    fn account(&self, counter: usize, m: Moved) {
        self.add_stat(counter, m.bytes);
        self.add_stat(STAT_BYTES_P2P, m.peer_bytes);
    }
}

fn alloc_status(e: AllocError) -> Status {
    match e {
        AllocError::Invalid => Status::Invalid,
        AllocError::NoSpace => Status::NoSpace,
        AllocError::NotFound => Status::NotFound,
        AllocError::Exists => Status::Exists,
    }
}
