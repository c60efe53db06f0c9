// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--supervise` with `--attach cxl`: the supervisor holds QEMU's vfio-user connection
//! (QEMU's `vfio-user-pci` connects once and never again) and relays it to a worker.
//!
//! A vfio-user session is set up by messages QEMU sends once: VERSION, the DMA maps with
//! their memory files, the interrupt eventfds. The relay keeps each once the worker has
//! accepted it (an unmap or a new set of eventfds replaces what it undoes) and replays
//! them to a new worker, whose replies it takes itself. Everything else a guest set up
//! lives in the device: registers in the state file (the function's, saved on every
//! change, `vfio/function.rs`; the CXL model's, `device/cxl.rs`), rings in its journal.
//! Requests the dead worker owed a reply go to the new one after the replay; QEMU sees a
//! slow reply, never a lost one. Data never passes through here: guest memory, device
//! memory (QEMU maps BAR4 from the file) and interrupts go straight to the worker.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::host::poll::wait_readable;
use crate::vfio::protocol::{
    command, Errno, Header, Reply, Request, DMA_UNMAP_ALL, FLAG_NO_REPLY, FLAG_TYPE_COMMAND,
    HEADER_SIZE, IRQ_SET_DATA_NONE, REGION_CONFIG,
};
use crate::vfio::socket::{self, Message, Received};

use super::workers::{Launcher, Worker};
use super::{cannot_keep, Restarts, SupervisorError};

/// How long a new worker may take to answer one replayed message.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// The set-up a new worker needs, in the order QEMU gave it.
#[derive(Default)]
struct SetUp {
    kept: Vec<Message>,
}

/// The request as the worker's server decodes it (None: one it refuses).
fn decoded(m: &Message) -> Option<Request<'_>> {
    Request::decode(&m.header, &m.payload, m.fds.len()).ok()
}

/// A DMA map's range: (iova, size).
fn mapped(m: &Message) -> Option<(u64, u64)> {
    match decoded(m)? {
        Request::DmaMap { iova, size, .. } => Some((iova, size)),
        _ => None,
    }
}

/// A SET_IRQS's (index, start, count).
fn vectors(m: &Message) -> Option<(u32, u32, u32)> {
    match decoded(m)? {
        Request::SetIrqs {
            index,
            start,
            count,
            ..
        } => Some((index, start, count)),
        _ => None,
    }
}

impl SetUp {
    /// A request the worker accepted (or one that wants no reply, on its way).
    fn note(&mut self, m: &Message) -> io::Result<()> {
        match decoded(m) {
            Some(Request::Version { .. }) => self
                .kept
                .retain(|k| !matches!(decoded(k), Some(Request::Version { .. }))),
            Some(Request::DmaMap { .. }) => {}
            Some(Request::DmaUnmap { flags, iova, size }) => {
                let all = flags & DMA_UNMAP_ALL != 0;
                self.kept
                    .retain(|k| mapped(k).is_none_or(|r| !all && r != (iova, size)));
                return Ok(());
            }
            Some(Request::SetIrqs {
                flags,
                index,
                start,
                count,
            }) => {
                // What this one sets replaces every earlier set of vectors inside it.
                let end = start.saturating_add(count);
                let all = flags & IRQ_SET_DATA_NONE != 0 && count == 0;
                self.kept.retain(|k| {
                    vectors(k).is_none_or(|(i, s, c)| {
                        i != index || !(all || (start <= s && s.saturating_add(c) <= end))
                    })
                });
                if all {
                    return Ok(());
                }
            }
            _ => return Ok(()),
        }
        self.kept.push(m.try_clone()?);
        Ok(())
    }

    /// Sends the set-up to a new worker and takes its replies (an error reply is logged:
    /// the message failed for the old worker too, or QEMU would not have gone on). Last,
    /// a read of config space tells the worker that the replay is over: its rings run
    /// from then on (see `CxlFunction::end_replay`).
    fn replay(&self, worker: &Worker) -> io::Result<()> {
        for m in self
            .kept
            .iter()
            .map(Message::try_clone)
            .chain([Ok(end_of_replay())])
        {
            // Each one answered, even one QEMU sent without wanting a reply.
            let mut m = m?;
            m.header.flags &= !FLAG_NO_REPLY;
            m.forward(&worker.conn).map_err(io::Error::other)?;
            let reply = reply_from(worker, REPLAY_TIMEOUT)?;
            if reply.header.id != m.header.id {
                return Err(io::Error::other(format!(
                    "a reply to message {} where {} was replayed",
                    reply.header.id, m.header.id
                )));
            }
            if reply.header.error != 0 {
                log::warn!(
                    "supervisor: the new worker refused replayed command {} (errno {})",
                    m.header.command,
                    reply.header.error
                );
            }
        }
        Ok(())
    }
}

/// The message that ends a replay: a read of the vendor ID.
fn end_of_replay() -> Message {
    let mut payload = 0u64.to_le_bytes().to_vec();
    payload.extend(REGION_CONFIG.to_le_bytes());
    payload.extend(4u32.to_le_bytes());
    Message {
        header: Header {
            id: u16::MAX,
            command: command::REGION_READ,
            size: (HEADER_SIZE + payload.len()) as u32,
            flags: FLAG_TYPE_COMMAND,
            error: 0,
        },
        payload,
        fds: Vec::new(),
        too_many_fds: false,
    }
}

/// The worker's next message, within `timeout` and while it lives.
fn reply_from(worker: &Worker, timeout: Duration) -> io::Result<Message> {
    let [ready, _gone] = wait_readable([worker.conn.as_fd(), worker.pidfd()], Some(timeout))?;
    if !ready {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no reply, or the worker died",
        ));
    }
    match socket::recv(&worker.conn) {
        Ok(Some(Received::Message(m))) => Ok(m),
        Ok(Some(Received::Discarded(_))) => Err(io::Error::other("an oversized reply")),
        Ok(None) => Err(io::ErrorKind::UnexpectedEof.into()),
        Err(e) => Err(io::Error::other(e)),
    }
}

/// Relays one QEMU connection; returns why it ended.
pub fn session(qemu: &UnixStream, launcher: &Launcher) -> Result<String, SupervisorError> {
    let mut set_up = SetUp::default();
    let mut worker = launcher.start_worker(false)?;
    // Requests the worker owes a reply, in the order QEMU sent them.
    let mut pending: Vec<Message> = Vec::new();
    let mut restarts = Restarts::default();
    loop {
        let [from_qemu, from_worker, worker_gone] =
            wait_readable([qemu.as_fd(), worker.conn.as_fd(), worker.pidfd()], None)
                .map_err(|e| SupervisorError::Io("poll", e))?;
        let mut worker_died = worker_gone && !from_worker;
        if from_worker {
            match socket::recv(&worker.conn) {
                Ok(Some(Received::Message(reply))) => {
                    if let Some(i) = pending.iter().position(|p| p.header.id == reply.header.id) {
                        let request = pending.remove(i);
                        if reply.header.error == 0 {
                            if let Err(e) = set_up.note(&request) {
                                worker.stop();
                                return Ok(cannot_keep(e));
                            }
                        }
                    }
                    if let Err(e) = reply.forward(qemu) {
                        worker.stop();
                        return Ok(format!("front-end gone ({e})"));
                    }
                }
                Ok(Some(Received::Discarded(_))) | Ok(None) | Err(_) => worker_died = true,
            }
        }
        if !worker_died && from_qemu {
            match socket::recv(qemu) {
                // More descriptors than a message may carry: they were closed, so the
                // message is refused here as the worker would (forwarded without them
                // it would mean something else).
                Ok(Some(Received::Message(m))) if m.too_many_fds => {
                    if !refuse(qemu, &m.header, Errno::EINVAL, "too many file descriptors") {
                        worker.stop();
                        return Ok("front-end gone".into());
                    }
                }
                Ok(Some(Received::Message(m))) => {
                    let kept = match m.header.message_type() {
                        FLAG_TYPE_COMMAND if m.header.no_reply() => set_up.note(&m),
                        FLAG_TYPE_COMMAND => m.try_clone().map(|c| pending.push(c)),
                        _ => Ok(()),
                    };
                    if let Err(e) = kept {
                        worker.stop();
                        return Ok(cannot_keep(e));
                    }
                    if m.forward(&worker.conn).is_err() {
                        worker_died = true;
                    }
                }
                // Too large for the worker too: answered here as it would be.
                Ok(Some(Received::Discarded(h))) => {
                    if !refuse(qemu, &h, Errno::E2BIG, "payload too large") {
                        worker.stop();
                        return Ok("front-end gone".into());
                    }
                }
                Ok(None) => {
                    worker.stop();
                    return Ok("front-end disconnected".into());
                }
                Err(e) => {
                    worker.stop();
                    return Ok(format!("front-end connection failed: {e}"));
                }
            }
        }
        if !worker_died {
            continue;
        }
        let mut ended_by_us = false;
        loop {
            if let Err(why) = restarts.after(&worker, ended_by_us, set_up.kept.len()) {
                return Ok(why);
            }
            worker = launcher.start_worker(true)?;
            let replayed = set_up.replay(&worker).and_then(|()| {
                pending.iter().try_for_each(|p| {
                    p.forward(&worker.conn)
                        .map_err(|e| io::Error::other(e.to_string()))
                })
            });
            match replayed {
                Ok(()) => break,
                Err(e) => {
                    log::warn!("supervisor: replay to the new worker failed: {e}");
                    worker.kill();
                    ended_by_us = true;
                }
            }
        }
    }
}

/// Answers a message the worker would refuse without reading it (none when it wants no
/// reply); false when QEMU is gone.
fn refuse(qemu: &UnixStream, h: &Header, errno: Errno, why: &str) -> bool {
    log::warn!(
        "supervisor: refused command {} (id {}, size {}): {why}",
        h.command,
        h.id,
        h.size
    );
    if h.no_reply() || h.message_type() != FLAG_TYPE_COMMAND {
        return true;
    }
    let reply = Reply::Error(errno).encode(h);
    socket::send(qemu, &reply, None).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfio::protocol::{IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD};
    use std::os::fd::OwnedFd;

    const EVENTFD_TRIGGER: u32 = IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER;

    fn message(command: u16, id: u16, payload: Vec<u8>, fds: usize) -> Message {
        let fds = (0..fds)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect();
        Message {
            header: Header {
                id,
                command,
                size: 16 + payload.len() as u32,
                flags: 0,
                error: 0,
            },
            payload,
            fds,
            too_many_fds: false,
        }
    }

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn version(id: u16) -> Message {
        let mut p = vec![0u8; 4];
        p.extend(b"{}\0");
        message(command::VERSION, id, p, 0)
    }

    fn map(id: u16, iova: u64, size: u64) -> Message {
        let mut p = [32u32, 3].map(u32::to_le_bytes).concat();
        p.extend(words(&[0, iova, size]));
        message(command::DMA_MAP, id, p, 1)
    }

    fn unmap(id: u16, flags: u32, iova: u64, size: u64) -> Message {
        let mut p = [24u32, flags].map(u32::to_le_bytes).concat();
        p.extend(words(&[iova, size]));
        message(command::DMA_UNMAP, id, p, 0)
    }

    fn irqs(id: u16, flags: u32, start: u32, count: u32) -> Message {
        let p = [20u32, flags, 2, start, count]
            .map(u32::to_le_bytes)
            .concat();
        let fds = if flags & IRQ_SET_DATA_NONE != 0 {
            0
        } else {
            count
        };
        message(command::DEVICE_SET_IRQS, id, p, fds as usize)
    }

    fn ids(s: &SetUp) -> Vec<u16> {
        s.kept.iter().map(|m| m.header.id).collect()
    }

    #[test]
    fn the_set_up_keeps_what_a_new_worker_needs_and_drops_what_was_undone() {
        let mut s = SetUp::default();
        s.note(&version(1)).unwrap();
        s.note(&map(2, 0, 1 << 20)).unwrap();
        s.note(&map(3, 1 << 20, 1 << 20)).unwrap();
        let write = [0u64, 0].map(u64::to_le_bytes).concat();
        s.note(&message(command::REGION_WRITE, 4, write, 0))
            .unwrap();
        s.note(&irqs(5, EVENTFD_TRIGGER, 0, 2)).unwrap();
        s.note(&irqs(6, EVENTFD_TRIGGER, 1, 1)).unwrap();
        assert_eq!(ids(&s), [1, 2, 3, 5, 6]);
        // A new set covering both replaces them; an unmap drops its map.
        s.note(&irqs(7, EVENTFD_TRIGGER, 0, 3)).unwrap();
        s.note(&unmap(8, 0, 0, 1 << 20)).unwrap();
        assert_eq!(ids(&s), [1, 3, 7]);
        // A message the server would refuse changes nothing.
        s.note(&unmap(9, 0x80, 1 << 20, 1 << 20)).unwrap();
        assert_eq!(ids(&s), [1, 3, 7]);
        // Tearing every vector down, and unmapping all.
        s.note(&irqs(10, IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER, 0, 0))
            .unwrap();
        s.note(&unmap(11, DMA_UNMAP_ALL, 0, 0)).unwrap();
        assert_eq!(ids(&s), [1]);
        // The descriptors are kept with the messages.
        s.note(&map(12, 0, 4096)).unwrap();
        assert_eq!(s.kept[1].fds.len(), 1);
    }

    #[test]
    fn a_replay_takes_the_new_workers_replies() {
        let mut s = SetUp::default();
        s.note(&version(1)).unwrap();
        let mut posted = map(2, 0, 4096);
        posted.header.flags |= FLAG_NO_REPLY;
        s.note(&posted).unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let worker = Worker::for_test(ours);
        let echo = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while let Ok(Some(Received::Message(m))) = socket::recv(&theirs) {
                assert!(!m.header.no_reply(), "a replayed message must be answered");
                seen.push((m.header.command, m.fds.len()));
                let reply = Reply::Error(Errno::EINVAL).encode(&m.header);
                socket::send(&theirs, &reply, None).unwrap();
            }
            seen
        });
        s.replay(&worker).unwrap();
        drop(worker);
        // The set-up, then the read that ends the replay (and the worker's is decodable).
        assert_eq!(
            echo.join().unwrap(),
            [
                (command::VERSION, 0),
                (command::DMA_MAP, 1),
                (command::REGION_READ, 0)
            ]
        );
        let end = end_of_replay();
        assert!(matches!(
            decoded(&end),
            Some(Request::RegionRead {
                offset: 0,
                region: REGION_CONFIG,
                count: 4
            })
        ));
    }
}
