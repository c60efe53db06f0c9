// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The ring layer driven as a driver would, with virtio-queue's `MockSplitQueue`.

use std::os::fd::FromRawFd;
use std::sync::atomic::AtomicBool;

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::device::command::encode::{hdr, with};
use crate::device::devmem::DeviceMemory;
use crate::device::{Device, DeviceConfig};
use crate::protocol::*;
use crate::ring::resume;

const REQ: u64 = 0x4000;
const RESP: u64 = 0x5000;
const DEVMEM: u64 = 2 << 20;

fn device() -> Device {
    let name = c"ring-test";
    // SAFETY: memfd_create with a valid C string; the new fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create failed");
    // SAFETY: fd was just created and nothing else owns it.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(DEVMEM).unwrap();
    Device::new(
        DeviceConfig::default(),
        DeviceMemory::from_file(file, DEVMEM).unwrap(),
    )
}

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
}

/// A driver's 16-entry split queue at 0, and the device's view of it.
fn queue(mem: &GuestMemoryMmap) -> (MockSplitQueue<'_, GuestMemoryMmap>, Queue) {
    let mq = MockSplitQueue::new(mem, 16);
    let q = mq.create_queue().unwrap();
    (mq, q)
}

fn desc(addr: u64, len: u32, flags: u32) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, 0))
}

/// Posts one chain of `descs` (NEXT links are set here) at descriptor index `first`.
fn post(mq: &MockSplitQueue<GuestMemoryMmap>, first: u16, descs: &[RawDescriptor]) {
    let n = descs.len();
    let linked: Vec<RawDescriptor> = descs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let d = Descriptor::from(*d);
            let (flags, next) = if i + 1 < n {
                (d.flags() | VRING_DESC_F_NEXT as u16, first + i as u16 + 1)
            } else {
                (d.flags(), 0)
            };
            RawDescriptor::from(Descriptor::new(d.addr().0, d.len(), flags, next))
        })
        .collect();
    mq.add_desc_chains(&linked, first).unwrap();
}

/// A request at REQ with a 32-byte response buffer at RESP, as descriptors 2k and 2k+1.
fn post_request(mem: &GuestMemoryMmap, mq: &MockSplitQueue<GuestMemoryMmap>, k: u16, req: &[u8]) {
    let at = REQ + 0x100 * k as u64;
    mem.write_slice(req, GuestAddress(at)).unwrap();
    post(
        mq,
        2 * k,
        &[
            desc(at, req.len() as u32, 0),
            desc(RESP + 0x100 * k as u64, 32, VRING_DESC_F_WRITE),
        ],
    );
}

fn take_all(q: &mut Queue, mem: &GuestMemoryMmap, dev: &Device) -> Vec<(ChainRequest, Origin)> {
    let cq = CmdQueue::of(QUEUE_CMD, 1).unwrap();
    take(q, mem, dev, Journal::of(dev.state()), cq, 64)
        .unwrap()
        .into_iter()
        .map(|t| (t.req, t.origin))
        .collect()
}

fn resp_at(mem: &GuestMemoryMmap, k: u16) -> Resp {
    mem.read_obj(GuestAddress(RESP + 0x100 * k as u64)).unwrap()
}

fn used(mem: &GuestMemoryMmap, mq: &MockSplitQueue<GuestMemoryMmap>, i: u16) -> (u32, u32) {
    let elem = mq.used_addr().0 + 4 + 8 * i as u64;
    let id: u32 = mem.read_obj(GuestAddress(elem)).unwrap();
    let len: u32 = mem.read_obj(GuestAddress(elem + 4)).unwrap();
    (id, len)
}

fn used_idx(mem: &GuestMemoryMmap, mq: &MockSplitQueue<GuestMemoryMmap>) -> u16 {
    mem.read_obj(GuestAddress(mq.used_addr().0 + 2)).unwrap()
}

#[test]
fn a_request_is_journaled_answered_and_returned() {
    let (mem, dev) = (memory(), device());
    let (mq, mut q) = queue(&mem);
    let journal = Journal::of(dev.state());
    post_request(&mem, &mq, 0, &hdr(OP_NOP, 0, 7));

    let got = take_all(&mut q, &mem, &dev);
    let [(req, origin)] = got.as_slice() else {
        panic!("{got:?}")
    };
    assert_eq!((req.head, req.hdr.tag, req.hdr.whole), (0, 7, true));
    assert_eq!(req.response_area(), (RESP, 32));
    // Taken, not yet answered: a successor would answer it INTERRUPTED.
    let pending = journal.pending(0, 16, 1);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].outcome, journal::Outcome::Unknown);

    let a = answer(&dev, &mem, req, *origin, &AtomicBool::new(false));
    assert_eq!(a.written, 32);
    let r = resp_at(&mem, 0);
    assert_eq!((r.status, r.tag), (Status::Ok as u32, 7));
    assert!(publish(&mut q, &mem, journal, 0, req.head, a.written));
    assert_eq!(used_idx(&mem, &mq), 1);
    assert_eq!(used(&mem, &mq, 0), (0, 32));
    assert!(journal.pending(0, 16, 1).is_empty());
    assert!(needs_signal(&mut q, &mem, false));
    // Nothing more: the queue is rearmed and left until the next kick.
    assert!(!Rearm::default().after_pass(&mut q, &mem, 1).unwrap());
}

#[test]
fn rearm_tells_a_lying_index_from_another_thread_taking() {
    let mem = memory();
    let (mq, mut q) = queue(&mem);
    post_request(&mem, &mq, 0, &hdr(OP_NOP, 0, 1));
    post_request(&mem, &mq, 1, &hdr(OP_NOP, 0, 2));
    let mut rearm = Rearm::default();
    // Nothing taken while the index shows two: look again.
    assert!(rearm.after_pass(&mut q, &mem, 0).unwrap());
    // Another thread took one meanwhile (the index still shows one more): progress.
    q.set_next_avail(1);
    assert!(rearm.after_pass(&mut q, &mem, 0).unwrap());
    assert!(rearm.after_pass(&mut q, &mem, 0).unwrap());
    // A second pass in a row in which nobody took anything: the index lies.
    assert!(matches!(
        rearm.after_pass(&mut q, &mem, 0),
        Err(super::Error::Stuck)
    ));
}

#[test]
fn malformed_chains_are_answered_with_their_error_and_tag() {
    let (mem, dev) = (memory(), device());
    let (mq, mut q) = queue(&mem);
    let req = hdr(OP_NOP, 0, 9);
    mem.write_slice(&req, GuestAddress(REQ)).unwrap();
    // Readable after writable breaks the layout of a request.
    post(
        &mq,
        0,
        &[
            desc(REQ, 16, 0),
            desc(RESP, 32, VRING_DESC_F_WRITE),
            desc(REQ, 16, 0),
        ],
    );
    // Larger than any request may be.
    post(
        &mq,
        3,
        &[
            desc(REQ, MAX_REQUEST + 1, 0),
            desc(RESP + 0x100, 32, VRING_DESC_F_WRITE),
        ],
    );
    let got = take_all(&mut q, &mem, &dev);
    assert_eq!(got.len(), 2);
    let never = AtomicBool::new(false);
    for ((req, origin), (k, status, tag)) in got
        .iter()
        .zip([(0, Status::BadChain, 9), (1, Status::TooLarge, 0)])
    {
        assert_eq!(req.error, Some(status));
        let a = answer(&dev, &mem, req, *origin, &never);
        assert_eq!(a.written, 32);
        let r = resp_at(&mem, k);
        assert_eq!((r.status, r.tag), (status as u32, tag), "chain {k}");
    }
}

#[test]
fn a_chain_with_too_many_response_segments_is_a_bad_chain() {
    let (mem, dev) = (memory(), device());
    let mq = MockSplitQueue::new(&mem, 128);
    let mut q = mq.create_queue().unwrap();
    let req = hdr(OP_NOP, 0, 5);
    mem.write_slice(&req, GuestAddress(REQ)).unwrap();
    let n = MAX_RESPONSE_SEGMENTS as usize + 1;
    let mut descs = vec![desc(REQ, 16, 0)];
    descs.extend((0..n as u64).map(|i| desc(RESP + i, 1, VRING_DESC_F_WRITE)));
    post(&mq, 0, &descs);
    let got = take_all(&mut q, &mem, &dev);
    let [(req, origin)] = got.as_slice() else {
        panic!("{got:?}")
    };
    assert_eq!(req.error, Some(Status::BadChain));
    assert_eq!(req.writable.len(), MAX_RESPONSE_SEGMENTS as usize);
    // The answer still goes to the segments kept (64 bytes of room).
    let a = answer(&dev, &mem, req, *origin, &AtomicBool::new(false));
    assert_eq!(a.written, 32);
    let r: Resp = mem.read_obj(GuestAddress(RESP)).unwrap();
    assert_eq!((r.status, r.tag), (Status::BadChain as u32, 5));

    // Exactly the limit is a request like any other.
    let mq = MockSplitQueue::new(&mem, 128);
    let mut q = mq.create_queue().unwrap();
    let mut descs = vec![desc(REQ, 16, 0)];
    descs.extend((0..MAX_RESPONSE_SEGMENTS as u64).map(|i| desc(RESP + i, 1, VRING_DESC_F_WRITE)));
    post(&mq, 0, &descs);
    let got = take_all(&mut q, &mem, &dev);
    assert_eq!(got[0].0.error, None);
}

#[test]
fn a_request_without_room_for_its_answer_does_not_run() {
    let (mem, dev) = (memory(), device());
    let (mq, mut q) = queue(&mem);
    let alloc = with(
        hdr(OP_ALLOC, 0, 3),
        &Alloc {
            size: 4096,
            align: 0,
        },
    );
    mem.write_slice(&alloc, GuestAddress(REQ)).unwrap();
    post(
        &mq,
        0,
        &[
            desc(REQ, alloc.len() as u32, 0),
            desc(RESP, 8, VRING_DESC_F_WRITE),
        ],
    );
    let got = take_all(&mut q, &mem, &dev);
    let a = answer(&dev, &mem, &got[0].0, got[0].1, &AtomicBool::new(false));
    assert_eq!(a.written, 0);
    assert!(a.reply.is_none());
    let ev = dev.pop_event().expect("an error event");
    assert_eq!((ev.kind, ev.value0), (EVENT_ERROR, OP_ALLOC as u64));
    assert_eq!(dev.stat(STAT_COMMANDS), 0, "the allocation must not run");
}

#[test]
fn a_cut_short_header_still_orders_but_names_no_tag() {
    let (mem, dev) = (memory(), device());
    let (mq, mut q) = queue(&mem);
    post_request(&mem, &mq, 0, &hdr(OP_NOP, FLAG_FENCE, 5)[..4]);
    let got = take_all(&mut q, &mem, &dev);
    let (req, origin) = &got[0];
    assert!(req.hdr.fenced());
    answer(&dev, &mem, req, *origin, &AtomicBool::new(false));
    let r = resp_at(&mem, 0);
    assert_eq!((r.status, r.tag), (Status::Truncated as u32, 0));
}

#[test]
fn events_fill_posted_buffers_and_wait_for_more() {
    let (mem, dev) = (memory(), device());
    let (mq, mut q) = queue(&mem);
    assert!(
        !deliver_events(&mut q, &mem, &dev),
        "no event, nothing used"
    );
    dev.post_event(EVENT_SIGNAL, 11, 12);
    dev.post_event(EVENT_SIGNAL, 21, 22);
    post(&mq, 0, &[desc(RESP, 64, VRING_DESC_F_WRITE)]);
    assert!(deliver_events(&mut q, &mem, &dev));
    let ev: Event = mem.read_obj(GuestAddress(RESP)).unwrap();
    assert_eq!((ev.kind, ev.value0, ev.value1), (EVENT_SIGNAL, 11, 12));
    assert_eq!(used(&mem, &mq, 0), (0, std::mem::size_of::<Event>() as u32));
    // The second waits for a buffer.
    assert!(dev.has_events());
}

#[test]
fn a_successor_answers_what_was_in_flight() {
    let (mem, dev) = (memory(), device());
    let (mq, mut q) = queue(&mem);
    let journal = Journal::of(dev.state());
    resume::adopt(QUEUE_CMD, &mut q, &mem, journal, false);
    for k in 0..3 {
        post_request(&mem, &mq, k, &hdr(OP_NOP, 0, 100 + k as u64));
    }
    let got = take_all(&mut q, &mem, &dev);
    assert_eq!(got.len(), 3);
    // Request 0 completes; 1 is answered but not yet published; 2 never ran. Then the
    // daemon dies.
    let never = AtomicBool::new(false);
    let a = answer(&dev, &mem, &got[0].0, got[0].1, &never);
    assert!(publish(&mut q, &mem, journal, 0, got[0].0.head, a.written));
    let a = answer(&dev, &mem, &got[1].0, got[1].1, &never);
    journal.completing(0, got[1].0.head, q.next_used(), a.written);

    // The successor's queue starts from the front-end's set-up, at 0.
    let mut q: Queue = mq.create_queue().unwrap();
    assert!(resume::adopt(QUEUE_CMD, &mut q, &mem, journal, true));
    assert_eq!(q.next_avail(), 3, "taken requests are not taken again");
    assert_eq!(used_idx(&mem, &mq), 3);
    let heads: Vec<u32> = (0..3).map(|i| used(&mem, &mq, i).0).collect();
    assert_eq!(heads, [0, 2, 4]);
    assert_eq!(resp_at(&mem, 1).status, Status::Ok as u32);
    let r = resp_at(&mem, 2);
    assert_eq!((r.status, r.tag), (Status::Interrupted as u32, 102));
    assert!(journal.pending(0, 16, 3).is_empty());
}
