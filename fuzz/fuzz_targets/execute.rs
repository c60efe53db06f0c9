// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Arbitrary requests executed by the device model against small guest and device
//! memories: a status for everything, no panic, and failed commands change nothing.
#![no_main]

#[path = "world.rs"]
mod world;

use std::sync::OnceLock;
use world::{memfd, World};

use cxl_accel::protocol::Status;
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

const RAM: u64 = 64 << 10;
const DEVMEM: u64 = 64 << 10;

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let regions = [0u64, 0x1_0000_0000]
            .into_iter()
            .map(|gpa| {
                let r = MmapRegion::from_file(FileOffset::new(memfd(RAM), 0), RAM as usize);
                GuestRegionMmap::new(r.unwrap(), GuestAddress(gpa)).unwrap()
            })
            .collect();
        World::new(DEVMEM, GuestMemoryMmap::from_regions(regions).unwrap())
    })
}

fn snapshot(w: &World) -> Vec<u8> {
    let mut v = vec![0u8; (2 * RAM + DEVMEM) as usize];
    let (a, rest) = v.split_at_mut(RAM as usize);
    let (b, c) = rest.split_at_mut(RAM as usize);
    w.mem.read_slice(a, GuestAddress(0)).unwrap();
    w.mem.read_slice(b, GuestAddress(0x1_0000_0000)).unwrap();
    w.device.devmem().slice(0, DEVMEM).unwrap().copy_to(c);
    v
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let before = snapshot(w);
    let reply = w.device.execute(&w.mem, data);
    let status = Status::from_u32(reply.resp.status).expect("a known status");
    if status != Status::Ok {
        assert!(reply.payload.is_empty());
        assert!(before == snapshot(w), "a failed command changed memory");
    }
});
