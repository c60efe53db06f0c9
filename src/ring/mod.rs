// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The ring layer: descriptor chains turned into requests for the device model, answers
//! turned into used entries, and the journal that lets a successor carry on after a
//! crash. It works on `virtio_queue::Queue` and guest memory only, with no vhost-user
//! type: the vhost-user backend (`crate::vhost`) and the `chain` fuzz target both
//! drive it, the one with threads and locks, the other in a loop.
//!
//! One request's way: [`take`] reads a chain ([`ChainRequest::parse`], which reads the
//! header once) and journals it; [`answer`] executes it and writes the reply; [`publish`]
//! returns the chain as a used entry; [`needs_signal`] says whether to interrupt the
//! driver; [`Rearm`] decides whether the queue must be looked at again.

mod chain;
mod events;
pub mod journal;
mod requests;
pub mod resume;
pub mod serve;
#[cfg(test)]
mod tests;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

pub use chain::{write_out, ChainRequest};
pub use events::deliver as deliver_events;
pub use journal::{Journal, Origin, MAX_QUEUE};
pub use requests::{answer, publish, take, Answer, Taken};
pub use serve::{Memory, Queues, Rings};

use crate::protocol::{cmd_queue_index, cmd_queue_of};

/// A command queue, named once where it is first seen: its virtqueue index (what the
/// ring and the journal know it by) and its number among the command queues (what
/// per-queue counters are indexed by).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdQueue {
    pub vq: usize,
    pub k: usize,
}

impl CmdQueue {
    /// Virtqueue `vq`, when it is one of the device's `count` command queues.
    pub fn of(vq: usize, count: usize) -> Option<CmdQueue> {
        cmd_queue_of(vq)
            .filter(|&k| k < count)
            .map(|k| CmdQueue { vq, k })
    }

    /// The device's `count` command queues.
    pub fn all(count: usize) -> impl Iterator<Item = CmdQueue> {
        (0..count).map(|k| CmdQueue {
            vq: cmd_queue_index(k),
            k,
        })
    }
}

/// Why a queue cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Kicks may arrive before the queue is set up: nothing to do yet.
    #[error("the queue is not ready")]
    NotReady,
    #[error("command queue unusable: {0}")]
    Unusable(virtio_queue::Error),
    /// The index counts entries that cannot be read (a ring outside guest memory) or that
    /// our own notification-flag writes move (overlapping rings): looping would spin.
    #[error("command queue unusable: its index shows requests that cannot be taken")]
    Stuck,
}

/// Whether the driver wants an interrupt for what was just returned (always, unless
/// EVENT_IDX says otherwise).
pub fn needs_signal(queue: &mut Queue, mem: &GuestMemoryMmap, event_idx: bool) -> bool {
    !event_idx || queue.needs_notification(mem).unwrap_or(true)
}

/// Ends the passes over a queue: notifications are enabled again after each, and a
/// driver that published meanwhile gets another pass.
#[derive(Default)]
pub struct Rearm {
    /// Passes in a row that took nothing although the ring index showed more.
    idle: u32,
    /// Where the queue stood after the previous pass. Another thread serving the same
    /// queue (an engine's completion) moves it too: progress, not an index that lies.
    last_avail: Option<u16>,
}

impl Rearm {
    /// After a pass that took `taken` requests: Ok(true) to look again, Ok(false) when the
    /// queue is empty and will be kicked, [`Error::Stuck`] after two passes in a row
    /// in which nobody took anything from an index that shows more.
    pub fn after_pass(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        taken: usize,
    ) -> Result<bool, Error> {
        if !queue.ready() {
            // Stopped meanwhile: its addresses are no longer the driver's.
            return Ok(false);
        }
        match queue.enable_notification(mem) {
            Ok(true) => {
                let at = queue.next_avail();
                let progressed = taken > 0 || self.last_avail.is_some_and(|last| last != at);
                self.last_avail = Some(at);
                self.idle = if progressed { 0 } else { self.idle + 1 };
                if self.idle < 2 {
                    Ok(true)
                } else {
                    Err(Error::Stuck)
                }
            }
            _ => Ok(false),
        }
    }
}
