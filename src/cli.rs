// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Command line of the `cxl-accel` daemon.

use std::path::PathBuf;

use clap::Parser;

use crate::device::Attach;
use crate::protocol::{Config, MAX_CMD_QUEUES, VIRTIO_ID};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketMode {
    Server,
    Client,
}

/// An option's value that cannot be used (clap prints it with the option's name).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("'{0}' is neither server nor client")]
    NeitherServerNorClient(String),
    #[error("'{0}' is not one of {1}")]
    NotOneOf(String, &'static str),
    #[error("unknown size suffix in '{0}' (use K, M, G or T)")]
    SizeSuffix(String),
    #[error("'{0}' is not a size (examples: 268435456, 256M, 4G)")]
    NotASize(String),
    #[error("size '{0}' is too large")]
    SizeTooLarge(String),
    #[error("'{0}' is not a group name")]
    NotAGroupName(String),
    #[error("no group named '{0}'")]
    NoSuchGroup(String),
    #[error("'{0}' is not a number")]
    NotANumber(String),
    #[error("queue size {0} must be a power of two from 1 to 32768")]
    QueueSize(u32),
}

/// Arguments that do not go together, or cannot be used as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("--fd is a listening socket: it does not go with --socket-mode client")]
    FdWithClient,
    #[error(
        "--attach shmem needs a power-of-two --memory-size (QEMU makes it a whole BAR): {0} is \
         not; use {1} or --attach bar"
    )]
    ShmemSize(String, String),
    #[error("--fd {0} is not a listening unix stream socket")]
    NotAListener(i32),
    #[error("--print-qemu-args needs --socket-path (QEMU's chardev path)")]
    NoSocketPath,
    #[error("--ram-node needs --guest-ram and --attach shmem or bar")]
    RamNode,
    #[error("--qemu-cxl-mem-bar needs --attach cxl")]
    CxlMemBar,
    #[error(transparent)]
    Value(#[from] ValueError),
}

fn parse_mode(s: &str) -> Result<SocketMode, ValueError> {
    match s {
        "server" => Ok(SocketMode::Server),
        "client" => Ok(SocketMode::Client),
        _ => Err(ValueError::NeitherServerNorClient(s.into())),
    }
}

fn parse_seccomp(s: &str) -> Result<crate::host::sandbox::Mode, ValueError> {
    use crate::host::sandbox::Mode;
    match s {
        "off" => Ok(Mode::Off),
        "log" => Ok(Mode::Log),
        "enforce" => Ok(Mode::Enforce),
        _ => Err(ValueError::NotOneOf(s.into(), "off, log, enforce")),
    }
}

fn parse_attach(s: &str) -> Result<Attach, ValueError> {
    match s {
        "shmem" => Ok(Attach::Shmem),
        "bar" => Ok(Attach::Bar),
        "numa" => Ok(Attach::Numa),
        "cxl" => Ok(Attach::Cxl),
        _ => Err(ValueError::NotOneOf(s.into(), "shmem, bar, numa, cxl")),
    }
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "cxl-accel",
    version,
    about = "vhost-user backend emulating a CXL Type-2 style accelerator with coherent device memory",
    long_about = "vhost-user backend emulating a CXL Type-2 style accelerator: device memory \
shared with QEMU and exposed to the guest as a BAR (of the virtio function itself with QEMU \
11.1, of an ivshmem-plain sibling with 10.2), plus a DMA/compute engine (copy, fill, checksum, atomics, page copies) working on guest memory, \
device memory and peer devices' memory.\n\nStart the daemon, then QEMU with the arguments \
printed by --print-qemu-args. Logging: RUST_LOG=info (default) or debug."
)]
pub struct Args {
    /// Unix socket QEMU connects to (its vhost-user chardev path). A stale socket left by a
    /// crashed daemon is replaced; a socket a live daemon is serving, or anything that is
    /// not a socket, is an error. Not needed with --fd.
    #[arg(long, value_name = "PATH", required_unless_present_any = ["fd", "print_capabilities"])]
    pub socket_path: Option<PathBuf>,

    /// A listening unix socket handed over by the caller (as libvirt does), used instead of
    /// --socket-path (vhost-user backend program conventions).
    #[arg(long, value_name = "FDNUM")]
    pub fd: Option<i32>,

    /// "server": the daemon listens on --socket-path and QEMU connects. "client": QEMU
    /// listens (its chardev has server=on) and the daemon connects, reconnecting whenever the
    /// connection drops; a restarted daemon finds QEMU again this way.
    #[arg(long, value_name = "server|client", default_value = "server", value_parser = parse_mode)]
    pub socket_mode: SocketMode,

    /// Device memory file, shared with QEMU (handed over with SHMEM_MAP in shmem mode, its
    /// memory-backend-file mem-path otherwise). Created and sized when missing; an existing file must have exactly --memory-size bytes. tmpfs (/dev/shm)
    /// or hugetlbfs paths work.
    #[arg(long, value_name = "PATH")]
    pub memory_path: PathBuf,

    /// Device memory size, a multiple of 2 MiB (a power of two in shmem mode: it is a whole
    /// BAR): bytes or with a K, M, G or T suffix, either case (256M, 4g).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub memory_size: u64,

    /// Virtio device ID for QEMU's vhost-user-test-device-pci. The default (21) is assigned by
    /// the virtio spec but implemented by neither Linux nor QEMU, so only our driver binds it.
    #[arg(long, value_name = "ID", default_value_t = VIRTIO_ID)]
    pub virtio_id: u32,

    /// Maximum size of each virtqueue (power of two, 1..32768).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = parse_queue_size)]
    pub queue_size: u16,

    /// Number of DMA engines, each a thread executing commands concurrently.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub dma_threads: u32,

    /// Command queues offered to the driver (one per guest CPU, or group of CPUs, so that
    /// threads on different CPUs never share a ring). QEMU gets one virtqueue more (events).
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=MAX_CMD_QUEUES as i64))]
    pub cmd_queues: u32,

    /// Requests moving at most this many bytes run on the ring's thread as they arrive,
    /// without a hop to a DMA engine (K, M suffixes; 0: every request goes to an engine).
    #[arg(long, value_name = "BYTES", default_value = "64K", value_parser = parse_size)]
    pub inline_max: u64,

    /// Busy-poll the command queues for up to this many microseconds after a request
    /// before waiting for the next kick; the window halves with every poll that finds
    /// nothing. Saves the driver its notification, at the price of a host CPU while it
    /// polls (0: off).
    #[arg(long, value_name = "US", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub poll_us: u32,

    /// Instance number of this device; names QEMU objects and picks PCI slot 0x10+N.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=15))]
    pub index: u32,

    /// Memory file of a peer device (repeatable). Its BAR, seen in the memory table, counts
    /// as peer-to-peer memory in the device statistics. With --attach cxl it is also how
    /// copies reach the peer at all (QEMU maps another device's BAR without its file): the
    /// daemon opens it when QEMU connects, and finds where the guest sees it in the peer's
    /// state file (its path plus ".state"), or else by a size no other peer has.
    #[arg(long, value_name = "PATH")]
    pub peer_memory_path: Vec<PathBuf>,

    /// How the guest sees device memory: "shmem" (a VIRTIO shared memory region, i.e. a BAR
    /// of the virtio function itself: one PCI function; needs QEMU >= 11.1), "bar" (BAR2 of
    /// an ivshmem-plain sibling function; QEMU >= 10.2), "numa" (a CPU-less NUMA node of
    /// guest RAM) or "cxl" (the daemon serves a PCIe function of its own over vfio-user, a
    /// CXL Type-2 endpoint under a CXL host bridge and root port; QEMU >= 11.1). With shmem,
    /// bar and cxl the driver manages it as coherent device pages.
    #[arg(long, value_name = "shmem|bar|numa|cxl", default_value = "shmem", value_parser = parse_attach)]
    pub attach: Attach,

    /// With --attach cxl: the CXL host bridge (0-3) this device is under; devices with the
    /// same number share it, each on a root port of its own. Host bridge N is created by
    /// device N (its --print-qemu-args), with a 4 GiB CXL window of its own.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=3))]
    pub cxl_host_bridge: u32,

    /// With --attach cxl and --print-qemu-args, for the device that prints guest RAM and
    /// the machine: how many CXL host bridges (1-4) the machine has, each with a 4 GiB CXL
    /// window. QEMU takes the whole window list from one -M option, so this device prints
    /// the windows of all of them (host bridge N itself comes with device N).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=4))]
    pub cxl_host_bridges: u32,

    /// With --attach cxl: QEMU carries qemu/patches/0001 (the PCI device property
    /// x-cxl-mem-bar, which routes a CXL window to the BAR holding a device's memory). The
    /// QEMU arguments name BAR 4 to it, so loads and stores to the CXL region reach device
    /// memory; stock QEMU refuses the property.
    #[arg(long)]
    pub qemu_cxl_mem_bar: bool,

    /// seccomp sandbox once serving: "enforce" (default: an unlisted system call kills the
    /// daemon with a message naming it), "log" (unlisted calls are logged by the kernel's
    /// audit) or "off". Opening files, exec, ptrace, other sockets than unix ones and
    /// executable memory are never allowed; under --supervise the thread that relays the
    /// front-end's messages has a shorter list of its own.
    #[arg(long, value_name = "off|log|enforce", default_value = "enforce", value_parser = parse_seccomp)]
    pub seccomp: crate::host::sandbox::Mode,

    /// Run the device in a worker process and restart it if it dies (crash, SIGKILL, OOM):
    /// this process keeps QEMU's connection, replays the set-up to the new worker, which
    /// continues from the state file. Commands in flight at the crash complete or fail with
    /// INTERRUPTED (-EIO in the guest). SIGTERM stops both.
    #[arg(long)]
    pub supervise: bool,

    /// Group (name or number) whose members may connect to the socket and open the memory
    /// file besides the daemon's user: both get mode 0660 and this group. For a QEMU that
    /// runs as another user (as under libvirt). Without it, both are 0600.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub socket_group: Option<libc::gid_t>,

    /// Crash-safe device state (allocations, exports, counters, command journal).
    /// Default: the memory file's path plus ".state". Locked while a daemon runs.
    #[arg(long, value_name = "PATH")]
    pub state_path: Option<PathBuf>,

    /// Control channel: a unix socket (0600) speaking JSON lines for `cxl-accel ctl`
    /// (device info, counters, trace, buffers, fault injection, poison). Under --supervise
    /// it stays open across worker restarts.
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,

    /// Internal (--supervise): the control listener, inherited from the supervisor.
    #[arg(long, value_name = "FD", hide = true)]
    pub control_fd: Option<i32>,

    /// Internal (--supervise): serve the one connection queued on this inherited listener.
    #[arg(long, value_name = "FD", hide = true)]
    pub worker_fd: Option<i32>,

    /// Internal (--supervise): the connection outlived a previous worker; continue it.
    #[arg(long, hide = true, requires = "worker_fd")]
    pub resume: bool,

    /// Print the QEMU arguments that attach this device, then exit.
    #[arg(long)]
    pub print_qemu_args: bool,

    /// Print the backend's capabilities as JSON (vhost-user backend program conventions)
    /// and exit; every other argument is ignored.
    #[arg(long)]
    pub print_capabilities: bool,

    /// With --print-qemu-args: size of the shared guest RAM backend to print (vhost-user needs
    /// shared guest RAM), or "none" when another device's arguments already carry it.
    #[arg(long, value_name = "SIZE|none", default_value = "1G")]
    pub guest_ram: String,

    /// With --print-qemu-args and --guest-ram: a second, CPU-less NUMA node of plain (shared)
    /// guest RAM of SIZE, a target for the kernel's move_pages() next to this device's memory,
    /// so that a benchmark compares the two in one boot. Not with --attach numa or cxl.
    #[arg(long, value_name = "SIZE")]
    pub ram_node: Option<String>,

    /// With --print-qemu-args: add reconnect-ms=MS to the chardev so QEMU reconnects after a
    /// daemon restart. 0 (default) leaves it out: QEMU 10.2's test device does not wait for
    /// a background connection at start-up and fails with "Failed to set msg fds".
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub reconnect_ms: u32,
}

impl Args {
    /// What the parser cannot check alone: combinations of arguments.
    pub fn check(&self) -> Result<(), ArgsError> {
        if self.fd.is_some() && self.socket_mode == SocketMode::Client {
            return Err(ArgsError::FdWithClient);
        }
        if matches!(self.attach, Attach::Shmem | Attach::Cxl) && !self.memory_size.is_power_of_two()
        {
            return Err(ArgsError::ShmemSize(
                qemu_size(self.memory_size),
                qemu_size(self.memory_size.next_power_of_two()),
            ));
        }
        if self.qemu_cxl_mem_bar && self.attach != Attach::Cxl {
            return Err(ArgsError::CxlMemBar);
        }
        Ok(())
    }

    /// `--state-path`, by default the memory file's path plus ".state".
    pub fn state_path(&self) -> PathBuf {
        self.state_path
            .clone()
            .unwrap_or_else(|| Self::state_path_of(&self.memory_path))
    }

    /// The default state file of the memory file `memory_path` (ours or a peer's).
    pub fn state_path_of(memory_path: &std::path::Path) -> PathBuf {
        with_suffix(memory_path, ".state")
    }

    /// Where a supervisor meets its workers: the socket path plus ".worker" (with --fd,
    /// the memory path plus ".worker").
    pub fn worker_socket(&self) -> PathBuf {
        match &self.socket_path {
            Some(p) => with_suffix(p, ".worker"),
            None => with_suffix(&self.memory_path, ".worker"),
        }
    }

    /// `--socket-path` (empty with --fd).
    pub fn socket_path(&self) -> &std::path::Path {
        self.socket_path
            .as_deref()
            .unwrap_or(std::path::Path::new(""))
    }

    /// Where the front-end reaches us, for the log.
    pub fn endpoint(&self) -> String {
        match self.fd {
            Some(fd) => format!("listening socket fd {fd}"),
            None => self.socket_path().display().to_string(),
        }
    }
}

fn with_suffix(path: &std::path::Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

pub fn parse_size(s: &str) -> Result<u64, ValueError> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(ValueError::SizeSuffix(s.into())),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| ValueError::NotASize(s.into()))?;
    n.checked_mul(mult)
        .ok_or_else(|| ValueError::SizeTooLarge(s.into()))
}

/// A group name or number, as a gid.
fn parse_group(s: &str) -> Result<libc::gid_t, ValueError> {
    if let Ok(gid) = s.parse::<libc::gid_t>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(s).map_err(|_| ValueError::NotAGroupName(s.into()))?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: group is plain data; getgrnam_r writes at most buf.len() bytes into buf and
    // sets `found` to null or to `group`.
    let gid = unsafe {
        let mut group: libc::group = std::mem::zeroed();
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(
            name.as_ptr(),
            &mut group,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        );
        (rc == 0 && !found.is_null()).then_some(group.gr_gid)
    };
    gid.ok_or_else(|| ValueError::NoSuchGroup(s.into()))
}

fn parse_queue_size(s: &str) -> Result<u16, ValueError> {
    let n: u32 = s.parse().map_err(|_| ValueError::NotANumber(s.into()))?;
    if n == 0 || n > 32768 || !n.is_power_of_two() {
        return Err(ValueError::QueueSize(n));
    }
    Ok(n as u16)
}

/// What `--print-capabilities` prints. No type of QEMU's vhost-user.json fits this device
/// (QEMU attaches it as vhost-user-test-device), so it names itself.
pub const CAPABILITIES: &str = "{\"type\": \"cxl-accel\", \"features\": []}";

/// Whether the command line asks for the capabilities (before anything else is parsed:
/// the other arguments are to be ignored).
pub fn wants_capabilities(args: impl Iterator<Item = String>) -> bool {
    args.skip(1).any(|a| a == "--print-capabilities")
}

/// Checks that `fd` is a listening unix stream socket (`--fd`) and keeps it from workers.
pub fn listening_socket(fd: i32) -> Result<std::os::unix::net::UnixListener, ArgsError> {
    let opt = |name: libc::c_int| -> Option<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes one int into `v`; a bad fd only makes it fail.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(v)
    };
    let ok = opt(libc::SO_DOMAIN) == Some(libc::AF_UNIX)
        && opt(libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && opt(libc::SO_ACCEPTCONN) == Some(1);
    if !ok {
        return Err(ArgsError::NotAListener(fd));
    }
    // SAFETY: fcntl on a descriptor we were given; no memory is involved.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the caller handed this listening socket over for our use.
    Ok(unsafe { <std::os::unix::net::UnixListener as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

fn qemu_size(bytes: u64) -> String {
    for (suffix, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// QEMU's option syntax doubles commas inside values.
fn qemu_escape(path: &std::path::Path) -> String {
    path.display().to_string().replace(',', ",,")
}

/// Quotes a word for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || ",./=_-:+@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The QEMU arguments that attach this device, as (option, value) pairs.
pub fn qemu_args(args: &Args) -> Result<Vec<(String, String)>, ArgsError> {
    let Some(socket_path) = &args.socket_path else {
        return Err(ArgsError::NoSocketPath);
    };
    let n = args.index;
    let slot = 0x10 + n;
    let mut v = Vec::new();
    if args.guest_ram == "none" && args.ram_node.is_some() {
        return Err(ArgsError::RamNode);
    }
    if args.guest_ram != "none" {
        let ram = parse_size(&args.guest_ram)?;
        v.push((
            "-object".into(),
            format!(
                "memory-backend-memfd,id=cxl-guest-ram,size={},share=on",
                qemu_size(ram)
            ),
        ));
        match (args.attach, &args.ram_node) {
            (Attach::Bar | Attach::Shmem, Some(node)) => {
                // With NUMA nodes, RAM is the sum of the nodes' backends.
                let size = parse_size(node)?;
                v.push((
                    "-object".into(),
                    format!(
                        "memory-backend-memfd,id=cxl-ram-node,size={},share=on",
                        qemu_size(size)
                    ),
                ));
                v.push(("-m".into(), qemu_size(ram + size)));
                v.push(("-machine".into(), "q35".into()));
                v.push(("-numa".into(), "node,nodeid=0,memdev=cxl-guest-ram".into()));
                v.push(("-numa".into(), "node,nodeid=1,memdev=cxl-ram-node".into()));
            }
            (_, Some(_)) => return Err(ArgsError::RamNode),
            (Attach::Bar | Attach::Shmem, None) => {
                v.push(("-m".into(), qemu_size(ram)));
                v.push(("-machine".into(), "q35,memory-backend=cxl-guest-ram".into()));
            }
            (Attach::Cxl, None) => {
                v.push(("-m".into(), qemu_size(ram)));
                v.push((
                    "-machine".into(),
                    "q35,cxl=on,memory-backend=cxl-guest-ram".into(),
                ));
                v.push(("-M".into(), cxl_windows(args.cxl_host_bridges)));
            }
            (Attach::Numa, None) => {
                // With NUMA nodes, RAM is the sum of the nodes: this covers guest RAM and
                // this device; with more NUMA-mode devices, -m must be raised to the total.
                v.push(("-m".into(), qemu_size(ram + args.memory_size)));
                v.push(("-machine".into(), "q35".into()));
                v.push(("-numa".into(), "node,nodeid=0,memdev=cxl-guest-ram".into()));
            }
        }
    }
    if args.attach == Attach::Cxl {
        cxl_qemu_args(args, socket_path, &mut v);
        return Ok(v);
    }
    let reconnect = match (args.socket_mode, args.reconnect_ms) {
        // QEMU listens and waits for the daemon before starting the guest.
        (SocketMode::Client, _) => ",server=on,wait=on".to_string(),
        (SocketMode::Server, 0) => String::new(),
        (SocketMode::Server, ms) => format!(",reconnect-ms={ms}"),
    };
    v.push((
        "-chardev".into(),
        format!(
            "socket,id=cxlacc{n}-sock,path={}{reconnect}",
            qemu_escape(socket_path)
        ),
    ));
    // In shmem mode the memory is a BAR of this one function (the daemon hands QEMU the
    // file); otherwise a second function or a NUMA node is backed by the file, by path.
    let multifunction = if args.attach == Attach::Bar {
        ",multifunction=on"
    } else {
        ""
    };
    v.push((
        "-device".into(),
        format!(
            "vhost-user-test-device-pci,id=cxlacc{n},chardev=cxlacc{n}-sock,virtio-id={},\
num_vqs={},vq_size={},config_size={},bus=pcie.0,addr={slot:#x}.0{multifunction}",
            args.virtio_id,
            args.cmd_queues + 1,
            args.queue_size,
            std::mem::size_of::<Config>()
        ),
    ));
    if args.attach == Attach::Shmem {
        return Ok(v);
    }
    v.push((
        "-object".into(),
        format!(
            "memory-backend-file,id=cxlacc{n}-mem,mem-path={},size={},share=on",
            qemu_escape(&args.memory_path),
            qemu_size(args.memory_size)
        ),
    ));
    v.push(match args.attach {
        Attach::Numa => (
            "-numa".into(),
            format!("node,nodeid={},memdev=cxlacc{n}-mem", n + 1),
        ),
        _ => (
            "-device".into(),
            format!(
                "ivshmem-plain,id=cxlacc{n}-bar,memdev=cxlacc{n}-mem,bus=pcie.0,addr={slot:#x}.1"
            ),
        ),
    });
    Ok(v)
}

/// CXL host bridge `b`'s PCI bus number: room for the buses of its root ports below it.
fn cxl_bus_nr(b: u32) -> u32 {
    12 + 50 * b
}

/// The CXL windows of host bridges `0..count`, 4 GiB each: one `-M` option, as QEMU
/// refuses the window list spread over several.
fn cxl_windows(count: u32) -> String {
    (0..count)
        .map(|b| format!("cxl-fmw.{b}.targets.0=cxlhb{b},cxl-fmw.{b}.size=4G"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `--attach cxl`: a root port on host bridge `--cxl-host-bridge` and the vfio-user
/// function on it; device N also creates host bridge N (pxb-cxl, with HDM decoders even
/// for one root port), whose window the device printing the machine declares.
fn cxl_qemu_args(args: &Args, socket: &std::path::Path, v: &mut Vec<(String, String)>) {
    let (n, b) = (args.index, args.cxl_host_bridge);
    if n == b {
        v.push((
            "-device".into(),
            format!(
                "pxb-cxl,bus_nr={},bus=pcie.0,id=cxlhb{b},hdm_for_passthrough=on",
                cxl_bus_nr(b)
            ),
        ));
    }
    v.push((
        "-device".into(),
        format!(
            "cxl-rp,port={n},bus=cxlhb{b},id=cxlrp{n},chassis=0,slot={}",
            2 + n
        ),
    ));
    let mut socket_json = serde_json::json!({
        "driver": "vfio-user-pci",
        "id": format!("cxlacc{n}"),
        "bus": format!("cxlrp{n}"),
        "socket": {"type": "unix", "path": socket.to_string_lossy()},
    });
    if args.qemu_cxl_mem_bar {
        socket_json["x-cxl-mem-bar"] = crate::vfio::function::DEVMEM_BAR.into();
    }
    v.push(("-device".into(), socket_json.to_string()));
}

/// Shell-pasteable rendering: one option per line, continued with backslashes.
pub fn render_qemu_args(pairs: &[(String, String)]) -> String {
    let lines: Vec<String> = pairs
        .iter()
        .map(|(o, val)| format!("{o} {}", shell_quote(val)))
        .collect();
    lines.join(" \\\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments with socket path `s` and memory path `m`, then `more`.
    fn with(more: &[&str]) -> Args {
        let base = ["cxl-accel", "--socket-path", "s", "--memory-path", "m"];
        Args::parse_from(base.iter().chain(more))
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(qemu_size(256 << 20), "256M");
        assert_eq!(qemu_size(3 << 30), "3G");
    }

    #[test]
    fn qemu_args_name_every_piece() {
        let args = Args::parse_from([
            "cxl-accel",
            "--socket-path",
            "/tmp/a b.sock",
            "--memory-path",
            "/dev/shm/m,1",
            "--index",
            "1",
            "--attach",
            "bar",
        ]);
        let text = render_qemu_args(&qemu_args(&args).unwrap());
        assert!(text.contains("'socket,id=cxlacc1-sock,path=/tmp/a b.sock'"));
        assert!(text.contains("mem-path=/dev/shm/m,,1,size=256M,share=on"));
        assert!(text.contains("virtio-id=21,num_vqs=5,vq_size=256,config_size=64"));
        assert!(text.contains("addr=0x11.0,multifunction=on"));
        assert!(
            text.contains("ivshmem-plain,id=cxlacc1-bar,memdev=cxlacc1-mem,bus=pcie.0,addr=0x11.1")
        );
        assert!(text.contains("memory-backend-memfd,id=cxl-guest-ram,size=1G,share=on"));
        let none = with(&["--guest-ram", "none"]);
        assert!(!render_qemu_args(&qemu_args(&none).unwrap()).contains("memfd"));
        let numa = with(&["--attach", "numa", "--index", "1"]);
        let text = render_qemu_args(&qemu_args(&numa).unwrap());
        assert!(text.contains("-numa node,nodeid=0,memdev=cxl-guest-ram"));
        assert!(text.contains("-numa node,nodeid=2,memdev=cxlacc1-mem"));
        assert!(text.contains("-m 1280M"));
        assert!(!text.contains("ivshmem"));
    }

    #[test]
    fn shmem_is_one_function_and_the_default() {
        let default = with(&[]);
        assert_eq!(default.attach, Attach::Shmem);
        // One default for the command line and the device model.
        assert_eq!(default.attach, Attach::default());
        let text = render_qemu_args(&qemu_args(&default).unwrap());
        assert!(text.contains("bus=pcie.0,addr=0x10.0"));
        assert!(!text.contains("multifunction"));
        assert!(!text.contains("ivshmem"));
        assert!(
            !text.contains("memory-backend-file"),
            "QEMU gets the file from the daemon"
        );
        assert!(text.contains("-machine q35,memory-backend=cxl-guest-ram"));
        // QEMU makes the region a whole BAR, whose size is a power of two.
        let odd = with(&["--memory-size", "96M"]);
        let e = odd.check().unwrap_err().to_string();
        assert!(e.contains("power-of-two") && e.contains("128M"), "{e}");
        let bar = with(&["--memory-size", "96M", "--attach", "bar"]);
        assert!(bar.check().is_ok());
    }

    #[test]
    fn ram_node_is_a_second_numa_node_of_shared_ram() {
        let text = render_qemu_args(&qemu_args(&with(&["--ram-node", "256M"])).unwrap());
        assert!(text.contains("memory-backend-memfd,id=cxl-ram-node,size=256M,share=on"));
        assert!(text.contains("-numa node,nodeid=0,memdev=cxl-guest-ram"));
        assert!(text.contains("-numa node,nodeid=1,memdev=cxl-ram-node"));
        assert!(text.contains("-m 1280M"));
        // NUMA nodes and the machine's own backend exclude each other in QEMU.
        assert!(!text.contains("memory-backend=cxl-guest-ram"));
        for bad in [
            &["--ram-node", "256M", "--attach", "numa"][..],
            &["--ram-node", "256M", "--attach", "cxl"],
            &["--ram-node", "256M", "--guest-ram", "none"],
        ] {
            let e = qemu_args(&with(bad)).unwrap_err().to_string();
            assert!(e.contains("--ram-node"), "{e}");
        }
    }

    #[test]
    fn cxl_topology_for_one_and_two_host_bridges() {
        // Device 0 prints the machine, host bridge 0 with its root port and function.
        let first = with(&["--attach", "cxl", "--cxl-host-bridges", "2"]);
        let text = render_qemu_args(&qemu_args(&first).unwrap());
        assert!(text.contains("-machine q35,cxl=on,memory-backend=cxl-guest-ram"));
        // Every window on one -M: QEMU refuses the list spread over several.
        assert_eq!(text.matches("-M ").count(), 1);
        assert!(text.contains(
            "-M cxl-fmw.0.targets.0=cxlhb0,cxl-fmw.0.size=4G,\
             cxl-fmw.1.targets.0=cxlhb1,cxl-fmw.1.size=4G"
        ));
        assert!(text.contains("pxb-cxl,bus_nr=12,bus=pcie.0,id=cxlhb0,hdm_for_passthrough=on"));
        assert!(text.contains("cxl-rp,port=0,bus=cxlhb0,id=cxlrp0"));
        assert!(text.contains(r#""driver":"vfio-user-pci","id":"cxlacc0""#));
        assert!(text.contains(r#""socket":{"path":"s","type":"unix"}"#));
        assert!(!text.contains("vhost-user") && !text.contains("chardev"));

        // Device 1 under host bridge 0: a second root port, no bridge, no machine.
        let shared = with(&["--attach", "cxl", "--index", "1", "--guest-ram", "none"]);
        let text = render_qemu_args(&qemu_args(&shared).unwrap());
        assert!(!text.contains("pxb-cxl") && !text.contains("-M ") && !text.contains("-machine"));
        assert!(text.contains("cxl-rp,port=1,bus=cxlhb0,id=cxlrp1"));
        assert!(text.contains(r#""bus":"cxlrp1""#));

        // Device 1 under host bridge 1: it creates that bridge, on buses of its own.
        let own = with(&[
            "--attach",
            "cxl",
            "--index",
            "1",
            "--cxl-host-bridge",
            "1",
            "--guest-ram",
            "none",
        ]);
        let text = render_qemu_args(&qemu_args(&own).unwrap());
        assert!(text.contains("pxb-cxl,bus_nr=62,bus=pcie.0,id=cxlhb1"));
        assert!(text.contains("cxl-rp,port=1,bus=cxlhb1,id=cxlrp1"));
        assert!(!text.contains("-M "));

        // A QEMU with qemu/patches is told which BAR the region reaches; stock QEMU is not.
        assert!(!text.contains("x-cxl-mem-bar"));
        let patched = with(&["--attach", "cxl", "--qemu-cxl-mem-bar"]);
        let text = render_qemu_args(&qemu_args(&patched).unwrap());
        assert!(text.contains(r#""x-cxl-mem-bar":4"#), "{text}");
        assert_eq!(
            with(&["--attach", "bar", "--qemu-cxl-mem-bar"]).check(),
            Err(ArgsError::CxlMemBar)
        );

        // The memory is a BAR: a power of two; host bridges 0-3.
        assert!(with(&["--attach", "cxl", "--memory-size", "96M"])
            .check()
            .is_err());
        let five = ["cxl-accel", "--socket-path", "s", "--memory-path", "m"]
            .iter()
            .chain(&["--attach", "cxl", "--cxl-host-bridges", "5"]);
        assert!(Args::try_parse_from(five).is_err());
    }
}
