// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Command line of the `cxl-accel` daemon ([`crate::qemu_args`] turns it into the QEMU
//! arguments that attach the device).

use std::path::PathBuf;

use clap::Parser;

use crate::device::Attach;
use crate::protocol::{MAX_CMD_QUEUES, VIRTIO_ID};

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

/// A size as QEMU writes it: in the largest unit that divides it.
pub(crate) fn qemu_size(bytes: u64) -> String {
    for (suffix, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
