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
//! slow reply, never a lost one (replies the dead worker sent are taken first, so nothing
//! runs twice). Data never passes through here: guest memory, device memory (QEMU maps
//! BAR4 from the file) and interrupts go straight to the worker.
//!
//! A write QEMU posts (no reply wanted) is lost if the worker dies before it: nothing says
//! whether it ran. QEMU posts none to this function (BAR4 is mappable, and its client then
//! posts nothing); set-up messages it posted are kept as sent.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::host::poll::wait_readable;
use crate::vfio::protocol::{
    command, Errno, Header, Reply, Request, DMA_UNMAP_ALL, FLAG_NO_REPLY, FLAG_TYPE_COMMAND,
    HEADER_SIZE, IRQ_MSIX, IRQ_SET_DATA_NONE, MAX_DMA_MAPS, REGION_CONFIG,
};
use crate::vfio::socket::{self, Message, Received};

use super::workers::{Launcher, Worker};
use super::{cannot_keep, start, wait, Restarts, SupervisorError, SEND_TIMEOUT};

/// How long a new worker may take to answer one replayed message.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Most set-up messages a session may leave to replay: as many DMA maps as the server
/// takes, and room for the rest.
const MAX_KEPT: usize = MAX_DMA_MAPS as usize + 256;
/// Descriptors the supervisor keeps for itself (listeners, pidfds, a new worker's
/// connection and pipes): a session's set-up may hold the rest.
const FD_RESERVE: u64 = 64;

/// How many descriptors a session's set-up may hold: read once, before the relay's
/// filter (which has no getrlimit), by [`super::run`].
pub(super) fn fd_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return 0;
        }
        limit.rlim_cur.saturating_sub(FD_RESERVE) as usize
    })
}

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
            // The server takes the first VERSION only.
            Some(Request::Version { .. }) => {
                if self
                    .kept
                    .iter()
                    .any(|k| k.header.command == command::VERSION)
                {
                    return Ok(());
                }
            }
            Some(Request::DmaMap { .. }) => {}
            Some(Request::DmaUnmap { flags, iova, size }) => {
                let all = flags & DMA_UNMAP_ALL != 0;
                self.kept
                    .retain(|k| mapped(k).is_none_or(|r| !all && r != (iova, size)));
                return Ok(());
            }
            // Only MSI-X has vectors; a set of none changes nothing but a teardown.
            Some(Request::SetIrqs {
                flags,
                index: IRQ_MSIX,
                start,
                count,
            }) => {
                // What this one sets replaces every earlier set of vectors inside it.
                let end = start.saturating_add(count);
                let all = flags & IRQ_SET_DATA_NONE != 0 && count == 0;
                self.kept.retain(|k| {
                    vectors(k).is_none_or(|(i, s, c)| {
                        i != IRQ_MSIX || !(all || (start <= s && s.saturating_add(c) <= end))
                    })
                });
                if all || count == 0 {
                    return Ok(());
                }
            }
            _ => return Ok(()),
        }
        // Bounded, descriptors first: the supervisor needs some of its own to start workers.
        let fds: usize = self.kept.iter().map(|k| k.fds.len()).sum();
        if self.kept.len() >= MAX_KEPT || fds + m.fds.len() > fd_budget() {
            return Err(io::Error::other(format!(
                "{} set-up messages holding {fds} descriptors already",
                self.kept.len()
            )));
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

/// What a relay does with one message (requests from QEMU, replies from the worker).
struct Relay<'a> {
    qemu: &'a UnixStream,
    set_up: SetUp,
    /// Requests the worker owes a reply, in the order QEMU sent them.
    pending: Vec<Message>,
}

impl Relay<'_> {
    /// A reply from the worker: to QEMU, and what it accepted into the set-up. Err: the
    /// session ends, for this reason.
    fn reply(&mut self, reply: Message) -> Result<(), String> {
        if let Some(i) = self
            .pending
            .iter()
            .position(|p| p.header.id == reply.header.id)
        {
            let request = self.pending.remove(i);
            if reply.header.error == 0 {
                self.set_up.note(&request).map_err(cannot_keep)?;
            }
        }
        reply
            .forward(self.qemu)
            .map_err(|e| format!("front-end gone ({e})"))
    }

    /// A request from QEMU: kept until answered (or into the set-up, when it wants no
    /// reply). Err: the session ends, for this reason.
    fn request(&mut self, m: &Message) -> Result<(), String> {
        let kept = match m.header.message_type() {
            FLAG_TYPE_COMMAND if m.header.no_reply() => self.set_up.note(m),
            FLAG_TYPE_COMMAND => m.try_clone().map(|c| self.pending.push(c)),
            _ => Ok(()),
        };
        kept.map_err(cannot_keep)
    }
}

/// Relays one QEMU connection; returns why it ended.
pub fn session(qemu: &UnixStream, launcher: &Launcher) -> Result<String, SupervisorError> {
    if let Err(e) = qemu.set_write_timeout(Some(SEND_TIMEOUT)) {
        log::warn!("supervisor: replies to the front-end may block: {e}");
    }
    let mut relay = Relay {
        qemu,
        set_up: SetUp::default(),
        pending: Vec::new(),
    };
    let mut worker = match start(launcher, false)? {
        Ok(w) => w,
        Err(why) => return Ok(why),
    };
    let mut restarts = Restarts::default();
    loop {
        let (from_qemu, from_worker, worker_gone) = wait(qemu, &worker)?;
        let mut worker_died = worker_gone && !from_worker;
        // The worker is alive but its connection failed: it is ended here.
        let mut failed_alive = false;
        if from_worker {
            match socket::recv(&worker.conn) {
                Ok(Some(Received::Message(reply))) => {
                    if let Err(why) = relay.reply(reply) {
                        worker.stop();
                        return Ok(why);
                    }
                }
                Ok(None) => worker_died = true,
                Ok(Some(Received::Discarded(_))) | Err(_) => {
                    (worker_died, failed_alive) = (true, true)
                }
            }
        }
        if !worker_died && from_qemu {
            let ended = match socket::recv(qemu) {
                // More descriptors than a message may carry: they were closed, so the
                // message is refused here as the worker would (forwarded without them
                // it would mean something else).
                Ok(Some(Received::Message(m))) if m.too_many_fds => {
                    refuse(qemu, &m.header, Errno::EINVAL, "too many file descriptors")
                        .then_some("front-end gone".to_string())
                }
                Ok(Some(Received::Message(m))) => match relay.request(&m) {
                    Ok(()) => {
                        if m.forward(&worker.conn).is_err() {
                            (worker_died, failed_alive) = (true, !worker_gone);
                        }
                        None
                    }
                    Err(why) => Some(why),
                },
                // Too large for the worker too: answered here as it would be.
                Ok(Some(Received::Discarded(h))) => {
                    refuse(qemu, &h, Errno::E2BIG, "payload too large")
                        .then_some("front-end gone".to_string())
                }
                Ok(None) => Some("front-end disconnected".into()),
                Err(e) => Some(format!("front-end connection failed: {e}")),
            };
            if let Some(why) = ended {
                worker.stop();
                return Ok(why);
            }
        }
        if !worker_died {
            continue;
        }
        if failed_alive {
            worker.kill();
        }
        // Replies the worker sent before it died are QEMU's: their requests must not run
        // again (the connection ends after them, the worker being gone).
        if let Err(why) = drain(&worker, &mut relay) {
            return Ok(why);
        }
        let set_up = relay.set_up.kept.len();
        let replay = |new: &Worker| {
            relay.set_up.replay(new)?;
            relay.pending.iter().try_for_each(|p| {
                p.forward(&new.conn)
                    .map_err(|e| io::Error::other(e.to_string()))
            })
        };
        worker = match restarts.replace(&worker, failed_alive, set_up, launcher, replay)? {
            Ok(w) => w,
            Err(why) => return Ok(why),
        };
    }
}

/// Takes the replies a dead worker left in its connection.
fn drain(worker: &Worker, relay: &mut Relay) -> Result<(), String> {
    if worker
        .conn
        .set_read_timeout(Some(Duration::from_secs(1)))
        .is_err()
    {
        return Ok(());
    }
    while let Ok(Some(Received::Message(reply))) = socket::recv(&worker.conn) {
        relay.reply(reply)?;
    }
    Ok(())
}

/// Answers a message the worker would refuse without reading it (none when it wants no
/// reply); true when QEMU is gone.
fn refuse(qemu: &UnixStream, h: &Header, errno: Errno, why: &str) -> bool {
    log::warn!(
        "supervisor: refused command {} (id {}, size {}): {why}",
        h.command,
        h.id,
        h.size
    );
    if h.no_reply() || h.message_type() != FLAG_TYPE_COMMAND {
        return false;
    }
    let reply = Reply::Error(errno).encode(h);
    socket::send(qemu, &reply, None).is_err()
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
        // A message the server would refuse changes nothing; nor does a second VERSION
        // (the server takes the first), or a set of no vectors, or of another index.
        s.note(&unmap(9, 0x80, 1 << 20, 1 << 20)).unwrap();
        s.note(&version(20)).unwrap();
        s.note(&irqs(21, EVENTFD_TRIGGER, 5, 0)).unwrap();
        let mut intx = irqs(22, EVENTFD_TRIGGER, 7, 0);
        intx.payload[8..12].copy_from_slice(&0u32.to_le_bytes());
        s.note(&intx).unwrap();
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
