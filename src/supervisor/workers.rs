// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The supervisor's worker processes. They are started by the main thread, the launcher:
//! the relay thread, which parses the front-end's bytes, runs under a seccomp filter
//! without fork, exec or file access (see `sandbox.rs`), and a filter would be inherited by
//! every worker it started. The relay watches and ends a worker only through its pidfd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

/// Pid of the current worker, for the signal thread.
pub static WORKER_PID: AtomicI32 = AtomicI32::new(0);

/// The supervisor is stopping (SIGTERM): a worker that ends now is not replaced.
pub static STOPPING: AtomicBool = AtomicBool::new(false);

/// A worker's exit status when it ended its session because it refused a front-end
/// message: the supervisor ends the front-end's session too, as an unsupervised daemon
/// would, instead of replaying the message to a new worker.
pub const EXIT_REFUSED: i32 = 3;

/// How long a worker whose connection ended may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Everything needed to start a worker.
pub struct WorkerSpec {
    /// Our own arguments, minus `--supervise`.
    pub args: Vec<String>,
    pub worker_socket: PathBuf,
    /// The control channel's listener (`--control-socket`), served by each worker in turn.
    pub control: Option<UnixListener>,
}

/// A running worker: its connection (as its front-end) and its pidfd.
pub struct Worker {
    pub pid: u32,
    pidfd: OwnedFd,
    pub conn: UnixStream,
    pub started: Instant,
}

/// How a worker ended, as far as the supervisor cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// SIGKILL: an operator or the OOM killer, never a crash loop.
    Killed,
    /// It refused a front-end message ([`EXIT_REFUSED`]).
    Refused,
    /// Anything else: a crash or an unexpected exit.
    Died,
}

/// Why a worker cannot be started.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("the launcher is gone")]
    LauncherGone,
    /// What could not be done ("start a worker"), and why.
    #[error("cannot {0}: {1}")]
    Io(&'static str, io::Error),
}

type Request = (bool, Sender<Result<Worker, WorkerError>>);

/// The relay's handle on the launcher.
pub struct Launcher {
    tx: Sender<Request>,
}

/// The launcher's side: the requests it serves.
pub struct Requests(Receiver<Request>);

/// A launcher and its requests; the thread that serves them (the main thread, so that
/// workers are children of the process's first task, where tools look for them) must not
/// be under the relay's filter.
pub fn launcher() -> (Launcher, Requests) {
    let (tx, rx) = channel();
    (Launcher { tx }, Requests(rx))
}

impl Launcher {
    /// Starts a worker (`resume`: it continues a connection an earlier worker served).
    pub fn start_worker(&self, resume: bool) -> Result<Worker, WorkerError> {
        let (reply, answer) = channel();
        self.tx
            .send((resume, reply))
            .map_err(|_| WorkerError::LauncherGone)?;
        answer.recv().map_err(|_| WorkerError::LauncherGone)?
    }
}

impl Requests {
    /// Starts workers on request until the [`Launcher`] is dropped.
    pub fn serve(self, spec: &WorkerSpec, workers: &UnixListener) {
        for (resume, reply) in self.0 {
            let _ = reply.send(launch(spec, workers, resume));
        }
    }
}

fn launch(spec: &WorkerSpec, workers: &UnixListener, resume: bool) -> Result<Worker, WorkerError> {
    // A connection a dead worker never accepted would go to this one: drop it first. No
    // worker runs now, so nobody else accepts meanwhile.
    let set_nonblocking = |on| {
        workers
            .set_nonblocking(on)
            .map_err(|e| WorkerError::Io("drain the worker socket", e))
    };
    set_nonblocking(true)?;
    while workers.accept().is_ok() {}
    set_nonblocking(false)?;
    // Queued in the listener's backlog; the worker accepts it as its front-end.
    let conn = UnixStream::connect(&spec.worker_socket)
        .map_err(|e| WorkerError::Io("connect to the worker socket", e))?;
    let fd = workers.as_raw_fd();
    let exe = std::env::current_exe().map_err(|e| WorkerError::Io("find our executable", e))?;
    let mut cmd = Command::new(exe);
    cmd.args(&spec.args).arg("--worker-fd").arg(fd.to_string());
    let control = spec.control.as_ref().map(|l| l.as_raw_fd());
    if let Some(c) = control {
        cmd.arg("--control-fd").arg(c.to_string());
    }
    if resume {
        cmd.arg("--resume");
    }
    // SAFETY: the closure runs in the child between fork and exec and only calls fcntl,
    // which is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            // The listeners are the worker's; everything else stays close-on-exec.
            for f in std::iter::once(fd).chain(control) {
                if libc::fcntl(f, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| WorkerError::Io("start a worker", e))?;
    let pid = child.id();
    // SAFETY: pidfd_open on our own child, not yet reaped (only its pidfd will reap it).
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        // Without a pidfd the worker cannot be watched: do not leave it running.
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        return Err(WorkerError::Io("watch the worker", e));
    }
    // SAFETY: pidfd_open returned a new descriptor that nobody else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    WORKER_PID.store(pid as i32, Ordering::Release);
    log::info!(
        "supervisor: worker pid {pid} started{}",
        if resume { " (resuming)" } else { "" }
    );
    Ok(Worker {
        pid,
        pidfd,
        conn,
        started: Instant::now(),
    })
}

impl Worker {
    /// A worker on `conn` that is this process (it never exits), for the relays' tests.
    #[cfg(test)]
    pub(crate) fn for_test(conn: UnixStream) -> Worker {
        // SAFETY: pidfd_open on our own pid; the new descriptor is owned below.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        assert!(raw >= 0, "pidfd_open: {}", io::Error::last_os_error());
        Worker {
            pid: std::process::id(),
            // SAFETY: pidfd_open returned a new descriptor that nobody else owns.
            pidfd: unsafe { OwnedFd::from_raw_fd(raw as i32) },
            conn,
            started: Instant::now(),
        }
    }

    /// Its exit, if it has exited (`hang`: wait for it).
    fn exited(&self, hang: bool) -> io::Result<Option<libc::siginfo_t>> {
        let flags = libc::WEXITED | if hang { 0 } else { libc::WNOHANG };
        loop {
            // SAFETY: siginfo_t is plain data that waitid fills; the pidfd is ours.
            let (rc, info) = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let rc = libc::waitid(
                    libc::P_PIDFD,
                    self.pidfd.as_raw_fd() as libc::id_t,
                    &mut info,
                    flags,
                );
                (rc, info)
            };
            if rc == 0 {
                // SAFETY: waitid filled `info` for a child state change (or left it zero).
                return Ok((unsafe { info.si_pid() } != 0).then_some(info));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Its pidfd: readable once it has exited.
    pub fn pidfd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.pidfd.as_fd()
    }

    /// SIGKILL, through its pidfd.
    pub fn kill(&self) {
        // SAFETY: pidfd_send_signal on our worker's pidfd; no memory is involved.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }

    /// Waits for a worker whose connection ended (killing it after [`EXIT_GRACE`]: its
    /// connection is of no use any more); how it ended, for the log and for what to do
    /// next.
    pub fn reap(&self) -> (String, End) {
        let deadline = Instant::now() + EXIT_GRACE;
        let mut info = self.exited(false);
        while matches!(info, Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            info = self.exited(false);
        }
        if matches!(info, Ok(None)) {
            log::warn!("supervisor: worker {} did not exit; killing it", self.pid);
            self.kill();
            info = self.exited(true);
        }
        let pid = self.pid;
        match info {
            Ok(Some(i)) => {
                // SAFETY: `i` was filled by waitid for an exited child.
                let status = unsafe { i.si_status() };
                match i.si_code {
                    libc::CLD_EXITED => (
                        format!("pid {pid} exited with {status}"),
                        if status == EXIT_REFUSED {
                            End::Refused
                        } else {
                            End::Died
                        },
                    ),
                    _ => (
                        format!("pid {pid} killed by signal {status}"),
                        if status == libc::SIGKILL {
                            End::Killed
                        } else {
                            End::Died
                        },
                    ),
                }
            }
            Ok(None) => (format!("pid {pid} did not exit"), End::Died),
            Err(e) => (format!("pid {pid} lost ({e})"), End::Died),
        }
    }

    /// Ends a worker whose front-end went away: it sees its connection close and exits.
    pub fn stop(self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
        self.reap();
    }
}
