// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--supervise`: the device runs in a worker process; this small parent holds the
//! front-end's connection and restarts a worker that dies, without the front-end noticing.
//!
//! Why a parent and not the front-end's reconnect: QEMU 10.2's vhost-user-base devices (the
//! test device included) clean up their vhost state on disconnect and never initialise it
//! again, so a reconnect after a backend crash aborts QEMU. Here the connection never drops.
//!
//! The parent relays vhost-user messages both ways and keeps the ones that define the
//! session (features, memory table, ring set-up, backend channel) with their file
//! descriptors. A new worker gets them replayed, takes the rings over from the journal in
//! the state file (see `state.rs`) and answers what was in flight. Data never passes
//! through the parent: kicks, calls and guest memory go straight to the worker.

mod message;
mod recording;
mod vfio_relay;
pub mod workers;

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use vhost::vhost_user::message::FrontendReq;

use crate::host::poll::wait_readable;
use crate::host::sandbox;
use crate::supervisor::workers::{End, Launcher, Worker, WorkerError};
pub use crate::supervisor::workers::{WorkerSpec, EXIT_REFUSED, STOPPING, WORKER_PID};
pub use message::{recv_message, send_message, Message};
pub use recording::Recording;

/// A worker that fails by itself this soon after starting counts towards a crash loop.
/// (A request that crashes the device cannot cause one: the next worker answers it
/// INTERRUPTED instead of running it again. SIGKILL, from an operator or the OOM killer,
/// never counts.)
const SHORT_LIFE: Duration = Duration::from_secs(1);
/// Consecutive short-lived workers before the supervisor gives up.
const CRASH_LOOP: u32 = 5;

/// Why the supervisor stops.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("worker socket: {0}")]
    WorkerSocket(crate::vhost::server::ServerError),
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    #[error("the relay thread panicked")]
    RelayPanicked,
    /// What failed ("poll"), and why.
    #[error("{0}: {1}")]
    Io(&'static str, io::Error),
    #[error(transparent)]
    Worker(#[from] crate::supervisor::workers::WorkerError),
}

/// What the supervisor relays: how QEMU speaks to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    VhostUser,
    /// `--attach cxl` ([`vfio_relay`]).
    VfioUser,
}

/// How long a send may wait for the other side to read: a front-end reads its replies
/// and a worker its requests at once, so only a front-end that does not read (or a worker
/// and the relay both blocked sending) gets here; the session ends, or the worker is
/// replaced, instead of the relay waiting for ever.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts a worker; a failure to start one (out of descriptors or processes) ends the
/// session, not the supervisor.
fn start(launcher: &Launcher, resume: bool) -> Result<Result<Worker, String>, SupervisorError> {
    match launcher.start_worker(resume) {
        Ok(w) => {
            if let Err(e) = w.conn.set_write_timeout(Some(SEND_TIMEOUT)) {
                log::warn!("supervisor: sends to the worker may block: {e}");
            }
            Ok(Ok(w))
        }
        Err(WorkerError::LauncherGone) => Err(WorkerError::LauncherGone.into()),
        Err(e) => Ok(Err(format!("cannot start a worker ({e}); session ended"))),
    }
}

/// Waits for a message from the front-end or the worker, or the worker's end: (from the
/// front-end, from the worker, worker gone). A worker that dies before it accepted its
/// connection never closes it (the connection waits in the listener we keep): its pidfd
/// says so.
fn wait(qemu: &UnixStream, worker: &Worker) -> Result<(bool, bool, bool), SupervisorError> {
    let [q, w, gone] = wait_readable([qemu.as_fd(), worker.conn.as_fd(), worker.pidfd()], None)
        .map_err(|e| SupervisorError::Io("poll", e))?;
    Ok((q, w, gone))
}

/// Why a session ends when the supervisor cannot keep what it must replay (out of file
/// descriptors: a front-end that maps without end). The next front-end is served.
fn cannot_keep(e: io::Error) -> String {
    format!("cannot keep the session's set-up ({e}); session ended")
}

/// How the supervisor reaches the front-end.
pub enum FrontEnd {
    Listen(UnixListener),
    Connect(PathBuf),
}

/// Serves front-end connections forever: a relay thread, under the seccomp filter
/// `seccomp` (the relay's own list), relays the front-end's messages; this thread starts
/// the workers, outside the filter.
pub fn run(
    front: FrontEnd,
    spec: WorkerSpec,
    seccomp: sandbox::Mode,
    protocol: Protocol,
) -> Result<(), SupervisorError> {
    // Private (0600) from the start: only our own workers connect to it.
    let workers = crate::vhost::server::bind_std(&spec.worker_socket, None)
        .map_err(SupervisorError::WorkerSocket)?;
    let (launcher, requests) = crate::supervisor::workers::launcher();
    // Outside the relay's filter.
    vfio_relay::fd_budget();
    let relay = std::thread::Builder::new()
        .name("relay".into())
        .spawn(move || {
            let profile = sandbox::Profile {
                connects: matches!(front, FrontEnd::Connect(_)),
                relay: true,
            };
            sandbox::apply(seccomp, profile, sandbox::Scope::ThisThread)?;
            if seccomp != sandbox::Mode::Off {
                log::info!("supervisor: seccomp filter installed on the relay ({seccomp:?})");
            }
            serve(front, &launcher, protocol)
        })
        .map_err(|e| SupervisorError::Io("cannot start the relay thread", e))?;
    requests.serve(&spec, &workers);
    let _ = std::fs::remove_file(&spec.worker_socket);
    relay.join().unwrap_or(Err(SupervisorError::RelayPanicked))
}

fn serve(front: FrontEnd, launcher: &Launcher, protocol: Protocol) -> Result<(), SupervisorError> {
    loop {
        let qemu = match &front {
            FrontEnd::Listen(l) => l
                .accept()
                .map(|(s, _)| s)
                .map_err(|e| SupervisorError::Io("cannot accept a connection", e))?,
            FrontEnd::Connect(path) => connect_retrying(path),
        };
        log::info!("supervisor: front-end connected");
        let end = match protocol {
            Protocol::VhostUser => session(&qemu, launcher)?,
            Protocol::VfioUser => vfio_relay::session(&qemu, launcher)?,
        };
        log::info!("supervisor: {end}");
    }
}

fn connect_retrying(path: &Path) -> UnixStream {
    let mut said = false;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return s,
            Err(e) => {
                if !said {
                    log::info!("waiting for the front-end at {} ({e})", path.display());
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Relays one front-end connection; returns why it ended.
fn session(qemu: &UnixStream, launcher: &Launcher) -> Result<String, SupervisorError> {
    let mut rec = Recording::default();
    let mut worker = match start(launcher, false)? {
        Ok(w) => w,
        Err(why) => return Ok(why),
    };
    // A request the worker has not answered yet: resent to a replacement.
    let mut pending: Option<Message> = None;
    let mut restarts = Restarts::default();
    loop {
        let (from_qemu, from_worker, worker_gone) = wait(qemu, &worker)?;
        let mut worker_died = worker_gone && !from_worker;
        if from_worker {
            match recv_message(worker.conn.as_fd()) {
                Ok(Some(reply)) => {
                    log::debug!(
                        "supervisor: worker -> front-end: request {} flags {:#x}",
                        reply.request(),
                        reply.flags()
                    );
                    if reply.is_reply() {
                        if let Some(p) = pending.take() {
                            if p.kind() == Some(FrontendReq::GET_VRING_BASE) {
                                rec.ring_stopped(p.ring());
                            }
                        }
                    }
                    if let Err(e) = send_message(qemu.as_fd(), &reply) {
                        worker.stop();
                        return Ok(format!("front-end gone ({e})"));
                    }
                }
                Ok(None) | Err(_) => worker_died = true,
            }
        }
        if !worker_died && from_qemu {
            match recv_message(qemu.as_fd()) {
                Ok(Some(m)) => {
                    log::debug!(
                        "supervisor: front-end -> worker: request {} flags {:#x}, {} fds",
                        m.request(),
                        m.flags(),
                        m.fds.len()
                    );
                    let kept = rec.note(&m).and_then(|()| {
                        if m.expects_reply() {
                            pending = Some(m.try_clone()?);
                        }
                        Ok(())
                    });
                    if let Err(e) = kept {
                        worker.stop();
                        return Ok(cannot_keep(e));
                    }
                    if send_message(worker.conn.as_fd(), &m).is_err() {
                        worker_died = true;
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
        // A worker whose connection failed may still be alive (it will not be used again).
        let set_up = rec.len();
        let replay = |worker: &Worker| {
            // The request the dead worker owed an answer: replay the rest, then ask again.
            if let Some(p) = &pending {
                rec.forget(p);
            }
            rec.replay(worker.conn.as_fd(), worker.pidfd())?;
            rec.kick_all();
            match &pending {
                Some(p) => {
                    rec.note(p)?;
                    send_message(worker.conn.as_fd(), p)
                }
                None => Ok(()),
            }
        };
        worker = match restarts.replace(&worker, false, set_up, launcher, replay)? {
            Ok(w) => w,
            Err(why) => return Ok(why),
        };
    }
}

/// A session's restarts, to tell a crash loop from workers killed now and then.
#[derive(Default)]
struct Restarts {
    restarts: u32,
    short_lived: u32,
}

impl Restarts {
    /// Replaces the dead `worker` (see [`Restarts::after`]) by a new one that `replay`
    /// hands the session to; a new worker that dies or hangs in it (its connection may
    /// never report anything) is killed and replaced at once. Err inside: why the session
    /// ends.
    fn replace(
        &mut self,
        worker: &Worker,
        ended_by_us: bool,
        set_up: usize,
        launcher: &Launcher,
        mut replay: impl FnMut(&Worker) -> io::Result<()>,
    ) -> Result<Result<Worker, String>, SupervisorError> {
        let mut dead = None;
        let mut ended_by_us = ended_by_us;
        loop {
            if let Err(why) = self.after(dead.as_ref().unwrap_or(worker), ended_by_us, set_up) {
                return Ok(Err(why));
            }
            let new = match start(launcher, true)? {
                Ok(w) => w,
                Err(why) => return Ok(Err(why)),
            };
            match replay(&new) {
                Ok(()) => return Ok(Ok(new)),
                Err(e) => {
                    log::warn!("supervisor: replay to the new worker failed: {e}");
                    new.kill();
                    ended_by_us = true;
                    dead = Some(new);
                }
            }
        }
    }

    /// Reaps the dead `worker` (`ended_by_us`: killed for failing its replay, a failure of
    /// its own); Ok to start the next one (after a pause in a crash loop), or why the
    /// session ends. `set_up`: how many set-up messages the next one gets.
    fn after(&mut self, worker: &Worker, ended_by_us: bool, set_up: usize) -> Result<(), String> {
        let lived = worker.started.elapsed();
        let (status, mut end) = worker.reap();
        if STOPPING.load(std::sync::atomic::Ordering::Acquire) {
            return Err(format!("worker {status}: the supervisor is stopping"));
        }
        if ended_by_us {
            end = End::Died;
        }
        if end == End::Refused {
            return Err(
                "the worker refused a front-end message; session ended (not replayed)".into(),
            );
        }
        self.short_lived = if lived < SHORT_LIFE && end != End::Killed {
            self.short_lived + 1
        } else {
            0
        };
        if self.short_lived >= CRASH_LOOP {
            // Whatever keeps killing workers came with this session: end it, and serve the
            // next front-end afresh.
            return Err(format!(
                "worker died {CRASH_LOOP} times in a row within {SHORT_LIFE:?} of starting \
                 (last: {status}); session ended"
            ));
        }
        self.restarts += 1;
        log::warn!(
            "supervisor: worker {status} after {:.1} s; restart {}, replaying {set_up} set-up \
             messages",
            lived.as_secs_f64(),
            self.restarts
        );
        if self.short_lived > 1 {
            std::thread::sleep(Duration::from_millis(100 << self.short_lived.min(5)));
        }
        Ok(())
    }
}
