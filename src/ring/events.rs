// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The event queue: device events written into buffers the driver posted.

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{ByteValued, GuestMemoryMmap};

use super::chain::write_out;
use crate::device::Device;

/// Moves pending device events into buffers the driver posted on the event queue; an
/// event that finds no buffer waits for the next. Returns whether a buffer was used.
pub fn deliver(queue: &mut Queue, mem: &GuestMemoryMmap, device: &Device) -> bool {
    let mut used = false;
    while let Some(ev) = device.pop_event() {
        let chain = match queue.iter(mem) {
            Ok(mut it) => it.next(),
            Err(_) => None,
        };
        let Some(chain) = chain else {
            device.unpop_event(ev);
            break;
        };
        let writable: Vec<(u64, u32)> = chain
            .clone()
            .filter(|d| d.is_write_only())
            .map(|d| (d.addr().0, d.len()))
            .collect();
        let room: u64 = writable.iter().map(|&(_, l)| l as u64).sum();
        let mut written = 0;
        if room >= std::mem::size_of_val(&ev) as u64 {
            written = write_out(mem, &writable, ev.as_slice());
        }
        if written as usize == std::mem::size_of_val(&ev) {
            device.event_delivered();
        } else {
            written = 0;
            device.event_dropped();
            device.reject(format_args!(
                "unusable event buffer ({room} bytes); event dropped"
            ));
        }
        if queue.add_used(mem, chain.head_index(), written).is_err() {
            break;
        }
        used = true;
    }
    used
}
