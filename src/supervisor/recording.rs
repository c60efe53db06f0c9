// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What a new worker needs of the session: the front-end's set-up messages, kept with
//! their descriptors, compacted, and replayed in the order a start sends them.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use vhost::vhost_user::message::FrontendReq::{self, *};

use crate::host::poll::wait_readable;

use super::message::{recv_message, send_message, Message, FLAG_NEED_REPLY};

/// The messages that define the session, compacted to what a new worker needs.
#[derive(Default)]
pub struct Recording {
    kept: Vec<Message>,
}

impl Recording {
    /// Takes note of a message on its way from the front-end to the worker.
    pub fn note(&mut self, m: &Message) -> io::Result<()> {
        let Some(req) = m.kind() else { return Ok(()) };
        match req {
            RESET_OWNER => {
                self.kept.clear();
                return Ok(());
            }
            RESET_DEVICE => {
                self.kept.retain(|k| k.ring().is_none());
                return Ok(());
            }
            SET_OWNER | SET_FEATURES | SET_PROTOCOL_FEATURES | SET_BACKEND_REQ_FD => {
                self.kept.retain(|k| k.kind() != Some(req));
            }
            SET_MEM_TABLE => self
                .kept
                .retain(|k| !matches!(k.kind(), Some(SET_MEM_TABLE | ADD_MEM_REG | REM_MEM_REG))),
            ADD_MEM_REG | REM_MEM_REG => {}
            SET_VRING_NUM | SET_VRING_ADDR | SET_VRING_BASE | SET_VRING_KICK | SET_VRING_CALL
            | SET_VRING_ERR | SET_VRING_ENABLE => {
                let ring = m.ring();
                self.kept
                    .retain(|k| !(k.kind() == Some(req) && k.ring() == ring));
            }
            _ => return Ok(()),
        }
        self.kept.push(m.try_clone()?);
        Ok(())
    }

    /// The front-end got a ring's base back: the ring is stopped, its set-up is void.
    pub fn ring_stopped(&mut self, ring: Option<u32>) {
        self.kept.retain(|k| k.ring().is_none() || k.ring() != ring);
    }

    /// Drops a request the dead worker owed an answer, to be sent again after the replay.
    pub fn forget(&mut self, m: &Message) {
        self.kept.retain(|k| !k.same_request(m));
    }

    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Sends the recorded set-up to a new worker (whose pidfd is `alive`), asking for no
    /// replies.
    pub fn replay(&self, sock: BorrowedFd, alive: BorrowedFd) -> io::Result<()> {
        // The backend learns that acks are on (REPLY_ACK) only from a GET_FEATURES it
        // answered; without one, a later NEED_REPLY from the front-end would go
        // unanswered and the front-end would wait for ever.
        query(sock, alive, GET_FEATURES)?;
        query(sock, alive, GET_PROTOCOL_FEATURES)?;
        // In the order a start sends them, whatever order they came in: the session, then
        // memory (ring addresses are translated through the table, and a table sent again
        // later, as when the guest maps a BAR, is recorded after the rings), then the rings,
        // which are enabled last, once fully set up: an enabled ring may be served at once
        // (a kick is waiting), and a completion signalled before its call fd is known is
        // lost; with EVENT_IDX the driver would then wait for ever.
        let mut ordered: Vec<&Message> = self.kept.iter().collect();
        ordered.sort_by_key(|m| match m.kind() {
            Some(SET_OWNER | SET_FEATURES | SET_PROTOCOL_FEATURES | SET_BACKEND_REQ_FD) => 0,
            Some(SET_MEM_TABLE | ADD_MEM_REG | REM_MEM_REG) => 1,
            Some(SET_VRING_ENABLE) => 3,
            _ => 2,
        });
        for m in ordered {
            let mut m = m.try_clone()?;
            m.set_flags(m.flags() & !FLAG_NEED_REPLY);
            send_message(sock, &m)?;
        }
        // The worker handles messages in order: once this is answered, its rings are set
        // up and enabled, so a kick sent now is not dropped by a ring not yet ready (with
        // EVENT_IDX the driver would not kick again until the device has looked).
        query(sock, alive, GET_FEATURES)
    }

    /// Wakes every recorded ring, so a new worker looks at what arrived meanwhile.
    pub fn kick_all(&self) {
        for m in self
            .kept
            .iter()
            .filter(|m| m.kind() == Some(SET_VRING_KICK))
        {
            if let Some(fd) = m.fds.first() {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a live buffer to an eventfd we hold.
                unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            }
        }
    }
}

/// How long a new worker may take to answer the replay's queries.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends a request that is always answered and waits for (and drops) the answer; fails
/// when `alive` (the worker's pidfd) says the worker died, or after [`REPLAY_TIMEOUT`].
fn query(sock: BorrowedFd, alive: BorrowedFd, request: FrontendReq) -> io::Result<()> {
    send_message(sock, &Message::query(request))?;
    match wait_readable([sock, alive], Some(REPLAY_TIMEOUT))? {
        [true, _] => {}
        [false, true] => return Err(io::Error::other("the worker died before it answered")),
        [false, false] => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the worker did not answer in time",
            ))
        }
    }
    match recv_message(sock)? {
        Some(r) if r.kind() == Some(request) && r.is_reply() => Ok(()),
        _ => Err(io::Error::other("the worker did not answer a query")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(req: FrontendReq, flags: u32, payload: &[u8]) -> Message {
        let size = payload.len() as u32;
        Message::new(req.into(), flags | 1, size, payload.to_vec(), Vec::new())
    }

    fn ring_msg(req: FrontendReq, ring: u32, v: u32) -> Message {
        let mut p = ring.to_le_bytes().to_vec();
        p.extend_from_slice(&v.to_le_bytes());
        msg(req, 0, &p)
    }

    fn requests(r: &Recording) -> Vec<(FrontendReq, Option<u32>)> {
        r.kept
            .iter()
            .map(|m| (m.kind().unwrap(), m.ring()))
            .collect()
    }

    #[test]
    fn recording_keeps_the_latest_set_up_per_ring() {
        let mut r = Recording::default();
        r.note(&msg(SET_OWNER, 0, &[])).unwrap();
        r.note(&msg(SET_FEATURES, 0, &[0; 8])).unwrap();
        r.note(&msg(SET_MEM_TABLE, FLAG_NEED_REPLY, &[0; 40]))
            .unwrap();
        for ring in 0..2 {
            r.note(&ring_msg(SET_VRING_NUM, ring, 256)).unwrap();
            r.note(&ring_msg(SET_VRING_BASE, ring, 0)).unwrap();
        }
        // Queries are not set-up.
        r.note(&msg(GET_FEATURES, 0, &[])).unwrap();
        assert_eq!(r.len(), 7);
        // Ring 0 stops and starts again: only its new set-up remains, after ring 1's.
        r.ring_stopped(Some(0));
        r.note(&msg(SET_FEATURES, 0, &[1; 8])).unwrap();
        r.note(&ring_msg(SET_VRING_NUM, 0, 128)).unwrap();
        assert_eq!(
            requests(&r),
            vec![
                (SET_OWNER, None),
                (SET_MEM_TABLE, None),
                (SET_VRING_NUM, Some(1)),
                (SET_VRING_BASE, Some(1)),
                (SET_FEATURES, None),
                (SET_VRING_NUM, Some(0)),
            ]
        );
        // A new memory table replaces the old one; RESET_OWNER forgets everything.
        r.note(&msg(SET_MEM_TABLE, 0, &[1; 40])).unwrap();
        assert_eq!(
            r.kept
                .iter()
                .filter(|m| m.kind() == Some(SET_MEM_TABLE))
                .count(),
            1
        );
        r.note(&msg(RESET_OWNER, 0, &[])).unwrap();
        assert!(r.is_empty());
    }

    #[test]
    fn replies_are_expected_for_queries_and_need_reply() {
        assert!(msg(GET_FEATURES, 0, &[]).expects_reply());
        assert!(ring_msg(GET_VRING_BASE, 0, 0).expects_reply());
        assert!(msg(SET_MEM_TABLE, FLAG_NEED_REPLY, &[]).expects_reply());
        assert!(!msg(SET_MEM_TABLE, 0, &[]).expects_reply());
        // Kick/call payloads carry the ring in their low byte.
        let kick = msg(SET_VRING_KICK, 0, &(0x101u64).to_le_bytes());
        assert_eq!(kick.ring(), Some(1));
    }
}
