// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use cxl_accel::cli::{Args, SocketMode};
use cxl_accel::device::devmem::{Access, DeviceMemory};
use cxl_accel::device::dispatch::Dispatcher;
use cxl_accel::device::state::StateFile;
use cxl_accel::device::{Device, DeviceConfig};
use cxl_accel::protocol::VIRTIO_ID;
use cxl_accel::qemu_args::{qemu_args, render_qemu_args};
use cxl_accel::supervisor;
use cxl_accel::vhost::server;
use std::os::fd::FromRawFd;
use vhost::vhost_user::Listener;

fn main() -> ExitCode {
    // `cxl-accel ctl ...`: the control channel's client, nothing else.
    if std::env::args().nth(1).as_deref() == Some("ctl") {
        let code = cxl_accel::control::ctl::main(std::env::args().skip(1));
        return ExitCode::from(code as u8);
    }
    if cxl_accel::cli::wants_capabilities(std::env::args()) {
        println!("{}", cxl_accel::cli::CAPABILITIES);
        return ExitCode::SUCCESS;
    }
    let args = Args::parse();
    if let Err(e) = args.check() {
        return fail(&e);
    }
    if args.print_qemu_args {
        return match qemu_args(&args) {
            Ok(pairs) => {
                print!("{}", render_qemu_args(&pairs));
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        };
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let result = if args.supervise && args.worker_fd.is_none() {
        supervise(args)
    } else if args.attach == cxl_accel::device::Attach::Cxl {
        run_vfio(args)
    } else {
        run(args)
    };
    if signals::terminating() {
        // The shutdown ended the session under us (a supervisor gone, sockets removed):
        // the signal thread finishes its work (unmapping shared memory) and exits.
        std::thread::sleep(std::time::Duration::from_secs(5));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Shutting down removes the sockets under the serving thread's feet: what fails
        // then is the shutdown's doing, not an error.
        Err(_) if signals::terminating() => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("cxl-accel: {e}");
    ExitCode::FAILURE
}

/// The daemon's own errors; every module's error is boxed with them and printed as one line.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("cannot start DMA engines: {0}")]
    Engines(std::io::Error),
    #[error("cannot block termination signals")]
    BlockSignals,
    #[error("cannot start signal thread: {0}")]
    SignalThread(std::io::Error),
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn run(args: Args) -> Result<()> {
    cxl_accel::host::sandbox::prepare(args.seccomp);
    // First, so that every thread started later inherits the blocked signal mask. In client
    // mode the socket is QEMU's and stays.
    let worker = args.worker_fd.is_some();
    // A socket handed over with --fd is the caller's to remove.
    let own_socket = (args.socket_mode == SocketMode::Server && !worker && args.fd.is_none())
        .then(|| cxl_accel::host::sandbox::removable(args.socket_path()))
        .flatten();
    signals::exit_on_termination(own_socket.into_iter().collect())?;
    if args.virtio_id != VIRTIO_ID {
        log::warn!(
            "virtio ID {} differs from {VIRTIO_ID}, which the cxl_accel guest driver binds",
            args.virtio_id
        );
    }
    // A worker runs under its supervisor's locks on the memory and state files.
    let (device, dispatcher) = open_device(&args, !worker)?;
    let mut listener = match (args.worker_fd, args.socket_mode) {
        // SAFETY: the supervisor passed this listening socket to us for our exclusive use.
        (Some(fd), _) => Some(unsafe { Listener::from_raw_fd(fd) }),
        (None, SocketMode::Server) => Some(match args.fd {
            Some(fd) => Listener::from(cxl_accel::cli::listening_socket(fd)?),
            None => server::bind(args.socket_path(), args.socket_group)?,
        }),
        (None, SocketMode::Client) => None,
    };
    // The control listener: a worker's is its supervisor's, inherited.
    let control = match (args.control_fd, &args.control_socket) {
        // SAFETY: the supervisor passed this listening socket to us for our exclusive use.
        (Some(fd), _) => Some(unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) }),
        (None, Some(path)) => Some(server::bind_std(path, None)?),
        (None, None) => None,
    };
    if let Some(l) = control {
        cxl_accel::control::serve(l, device.clone())
            .map_err(|e| format!("cannot start the control channel: {e}"))?;
    }
    log::info!(
        "cxl-accel {} on {} ({} bytes of device memory in {}, {} DMA engines)",
        env!("CARGO_PKG_VERSION"),
        args.endpoint(),
        args.memory_size,
        args.memory_path.display(),
        args.dma_threads
    );
    // Everything that opens files or creates the socket is done: drop into the sandbox.
    enter_sandbox(&args, args.socket_mode == SocketMode::Client && !worker)?;
    let endpoint = match listener.as_mut() {
        Some(l) => server::Endpoint::Listen(l),
        None => server::Endpoint::Connect(args.socket_path().to_path_buf()),
    };
    // A worker serves its supervisor's one connection, then exits.
    let sessions = worker.then_some(1);
    let end = server::serve_endpoint(
        endpoint,
        device,
        dispatcher,
        args.queue_size,
        sessions,
        args.resume,
    )?;
    if worker && end == server::SessionEnd::Refused {
        // Tells the supervisor to end the front-end's session rather than replay to a new
        // worker the message this one refused.
        std::process::exit(supervisor::EXIT_REFUSED);
    }
    Ok(())
}

/// The whole process into the seccomp sandbox (`connects`: it may still connect a socket).
fn enter_sandbox(args: &Args, connects: bool) -> Result<()> {
    use cxl_accel::host::sandbox::{apply, Mode, Profile, Scope};
    let profile = Profile {
        connects,
        relay: false,
    };
    apply(args.seccomp, profile, Scope::Process)?;
    if args.seccomp != Mode::Off {
        log::info!("seccomp filter installed ({:?})", args.seccomp);
    }
    Ok(())
}

/// The device model over the memory and state files, and its DMA engines. `own_files`:
/// this process locks the files (a supervised worker runs under its supervisor's locks).
fn open_device(args: &Args, own_files: bool) -> Result<(Arc<Device>, Arc<Dispatcher>)> {
    let access = Access {
        lock: own_files,
        group: args.socket_group,
    };
    let devmem = DeviceMemory::open_with(&args.memory_path, args.memory_size, access)?;
    let (state, restored) =
        StateFile::open(&args.state_path(), devmem.id(), devmem.size(), own_files)?;
    log::info!("state {}: {}", args.state_path().display(), restored.note);
    let cfg = DeviceConfig {
        index: args.index,
        attach: args.attach,
        dma_engines: args.dma_threads,
        peers: args.peer_memory_path.clone(),
        cmd_queues: args.cmd_queues,
        inline_max: args.inline_max,
        poll_us: args.poll_us,
        ..Default::default()
    };
    // Where the guest saw device memory is for a worker that takes over to keep (peers'
    // daemons read it meanwhile); a daemon that starts afresh has not been mapped yet.
    if !args.resume {
        state.set_guest_address(None);
    }
    let device = Arc::new(Device::with_state(cfg, devmem, Arc::new(state), restored));
    let dispatcher = Arc::new(Dispatcher::new(args.dma_threads as usize).map_err(Error::Engines)?);
    Ok((device, dispatcher))
}

/// `--attach cxl`: the device as a PCIe function of its own, served over vfio-user to
/// QEMU's vfio-user-pci on --socket-path, until SIGTERM.
fn run_vfio(args: Args) -> Result<()> {
    use cxl_accel::vfio::{function::CxlFunction, peers::Peers, server as vfio_server};

    cxl_accel::host::sandbox::prepare(args.seccomp);
    check_vfio_socket(&args)?;
    // A worker (--supervise) serves its supervisor's socket and files, which stay.
    let worker = args.worker_fd.is_some();
    let own_socket = (!worker)
        .then(|| cxl_accel::host::sandbox::removable(args.socket_path()))
        .flatten();
    signals::exit_on_termination(own_socket.into_iter().collect())?;
    let (device, dispatcher) = open_device(&args, !worker)?;
    let listener = match args.worker_fd {
        // SAFETY: the supervisor passed this listening socket to us for our exclusive use.
        Some(fd) => unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) },
        None => vfio_server::bind(args.socket_path(), args.socket_group)?,
    };
    let control = match (args.control_fd, &args.control_socket) {
        // SAFETY: the supervisor passed this listening socket to us for our exclusive use.
        (Some(fd), _) => Some(unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) }),
        (None, Some(path)) => Some(server::bind_std(path, None)?),
        (None, None) => None,
    };
    if let Some(l) = control {
        cxl_accel::control::serve(l, device.clone())
            .map_err(|e| format!("cannot start the control channel: {e}"))?;
    }
    let mut function = CxlFunction::with_resume(device, dispatcher, args.queue_size, args.resume)
        .map_err(|e| format!("cannot set up the PCI function: {e}"))?;
    log::info!(
        "cxl-accel {} on {} (vfio-user, a CXL Type-2 endpoint; {} bytes of device memory in {}, {} DMA engines)",
        env!("CARGO_PKG_VERSION"),
        args.socket_path().display(),
        args.memory_size,
        args.memory_path.display(),
        args.dma_threads
    );
    if args.qemu_cxl_mem_bar {
        log::info!(
            "the CXL region's host-physical range reaches device memory (BAR4) through QEMU's \
             x-cxl-mem-bar (qemu/patches); the driver checks it (sysfs cxl: backed)"
        );
    } else {
        log::info!(
            "the CXL region's host-physical range is not backed in stock QEMU (it routes CXL \
             window accesses only to its cxl-type3 devices: loads read 0, stores are dropped); \
             the guest reaches device memory through BAR4 (the driver checks which it has; \
             qemu/patches and --qemu-cxl-mem-bar back the region)"
        );
    }
    // Peers' memory files exist once QEMU comes (it starts after every daemon), and
    // opening files ends with the sandbox: open them between the two.
    let server = vfio_server::Server::new(listener)?;
    let Some(first) = server.accept()? else {
        return Ok(());
    };
    let peers = Peers::open(&args.peer_memory_path, Args::state_path_of);
    function.set_peers(peers);
    enter_sandbox(&args, false)?;
    server.session(first, &mut function);
    if worker {
        // The supervisor's one connection: when it ends, so does the worker.
        return Ok(());
    }
    server.serve(&mut function, None)?;
    Ok(())
}

/// `--attach cxl` serves vfio-user on a socket it binds itself (or its supervisor did).
fn check_vfio_socket(args: &Args) -> Result<()> {
    if args.socket_mode == SocketMode::Client || args.fd.is_some() {
        return Err(
            "--attach cxl serves vfio-user on its own socket: no --fd or --socket-mode client"
                .into(),
        );
    }
    Ok(())
}

/// `--supervise`: keep QEMU's connection here and run the device in restartable workers.
fn supervise(args: Args) -> Result<()> {
    cxl_accel::host::sandbox::prepare(args.seccomp);
    let protocol = if args.attach == cxl_accel::device::Attach::Cxl {
        check_vfio_socket(&args)?;
        supervisor::Protocol::VfioUser
    } else {
        supervisor::Protocol::VhostUser
    };
    let worker_socket = args.worker_socket();
    let mut cleanup = vec![worker_socket.clone()];
    if args.socket_mode == SocketMode::Server && args.fd.is_none() {
        cleanup.push(args.socket_path().to_path_buf());
    }
    let cleanup = cleanup
        .iter()
        .filter_map(|p| cxl_accel::host::sandbox::removable(p))
        .collect();
    signals::exit_on_termination(cleanup)?;
    // Same checks as a worker makes, so a bad argument fails here once, not in a loop; the
    // locks on the memory and state files are held here for every worker.
    let access = Access {
        lock: true,
        group: args.socket_group,
    };
    let _devmem = DeviceMemory::open_with(&args.memory_path, args.memory_size, access)?;
    let _lock = cxl_accel::device::state::lock(&args.state_path())?;
    let front = match args.socket_mode {
        SocketMode::Server => supervisor::FrontEnd::Listen(match args.fd {
            Some(fd) => cxl_accel::cli::listening_socket(fd)?,
            None => server::bind_std(args.socket_path(), args.socket_group)?,
        }),
        SocketMode::Client => supervisor::FrontEnd::Connect(args.socket_path().to_path_buf()),
    };
    log::info!(
        "cxl-accel {} supervising on {} (state in {})",
        env!("CARGO_PKG_VERSION"),
        args.endpoint(),
        args.state_path().display()
    );
    // Bound here, so that it stays open while workers come and go; each worker serves it.
    let control = match &args.control_socket {
        Some(path) => Some(server::bind_std(path, None)?),
        None => None,
    };
    let worker_args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--supervise")
        .collect();
    let spec = supervisor::WorkerSpec {
        args: worker_args,
        worker_socket,
        control,
    };
    Ok(supervisor::run(front, spec, args.seccomp, protocol)?)
}

mod signals {
    use std::ffi::CStr;

    static TERMINATING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// A termination signal arrived and the process is on its way out.
    pub fn terminating() -> bool {
        TERMINATING.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Blocks SIGTERM/SIGINT in every thread and exits cleanly from a dedicated one.
    /// Device memory lives in the shared file, so there is nothing else to save.
    pub fn exit_on_termination(remove: Vec<&'static CStr>) -> Result<(), super::Error> {
        // SAFETY: sigset_t is plain data; the libc calls only fill and apply it, and this
        // runs before the worker threads that inherit the mask are created.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(super::Error::BlockSignals);
            }
            set
        };
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` is a valid, initialised signal set and `sig` a valid out-pointer.
                let rc = unsafe { libc::sigwait(&set, &mut sig) };
                TERMINATING.store(true, std::sync::atomic::Ordering::Release);
                if rc == 0 {
                    log::info!("signal {sig} received, shutting down");
                }
                // A supervisor takes its worker down with it (and starts no other).
                cxl_accel::supervisor::STOPPING.store(true, std::sync::atomic::Ordering::Release);
                let worker =
                    cxl_accel::supervisor::WORKER_PID.load(std::sync::atomic::Ordering::Acquire);
                if worker > 0 {
                    // SAFETY: sends a signal; no memory is involved.
                    unsafe { libc::kill(worker, libc::SIGTERM) };
                    // Its own shutdown (unmapping shared memory) needs its connection:
                    // leave only once it is gone (or after 3 s).
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_secs(3) {
                        // SAFETY: siginfo_t is plain data; waitid only fills it, and WNOWAIT
                        // leaves the child for the relay to reap.
                        let gone = unsafe {
                            let mut info: libc::siginfo_t = std::mem::zeroed();
                            let rc = libc::waitid(
                                libc::P_PID,
                                worker as libc::id_t,
                                &mut info,
                                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                            );
                            rc != 0 || info.si_pid() != 0
                        };
                        if gone {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
                // Shared-memory attach: the guest stops seeing memory of a device that is gone.
                cxl_accel::vhost::announcer::unmap_before_exit();
                for s in remove {
                    cxl_accel::host::sandbox::remove(s);
                }
                std::process::exit(0);
            })
            .map_err(super::Error::SignalThread)?;
        Ok(())
    }
}
