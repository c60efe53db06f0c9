// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! seccomp sandbox: after start-up the daemon needs only a short list of system calls
//! (sockets it already has, shared-memory mappings, eventfds, threads, futexes, logging).
//! Anything else — opening files, exec, ptrace, network — is refused, and the calls that
//! are allowed are narrowed by their arguments where it matters:
//!
//! - `socket` only for AF_UNIX stream sockets and `connect` only where the daemon connects
//!   (client socket mode; the supervisor reaching its workers), never in a server-mode
//!   worker or daemon;
//! - `ioctl` only FIONBIO (non-blocking sockets) and TCGETS (is stderr a terminal);
//! - `mmap` and `mprotect` never with PROT_EXEC;
//! - `clone` only for threads (CLONE_THREAD, CLONE_VM, CLONE_SIGHAND), and `clone3`, whose
//!   flags a filter cannot see, answers ENOSYS (glibc then uses `clone`);
//! - `unlink` only of the daemon's own socket, by the address of a path fixed before the
//!   filter (`removable`): a filter cannot read a path, only compare the pointer, so this
//!   keeps code that builds a path elsewhere from removing it (code that could rewrite
//!   those bytes could do more anyway).
//!
//! The supervisor's relay thread, which parses the front-end's bytes, has a list of its own
//! (`Profile::relay`): no files, no exec, no threads; the thread that starts workers (fork
//! and exec) stays outside the filter.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::path::Path;
use std::sync::Mutex;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No filter.
    Off,
    /// Unlisted system calls are allowed but logged by the kernel (audit), for finding
    /// what a new code path needs.
    Log,
    /// Unlisted system calls kill the daemon.
    Enforce,
}

/// What a process (or the relay thread) may do besides the common list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// It connects to unix sockets (client socket mode, or a supervisor's relay).
    pub connects: bool,
    /// The supervisor's relay thread: its own short list instead of the daemon's.
    pub relay: bool,
}

/// System calls the daemon and the supervisor's relay both make once they serve:
/// vhost-user messages with fds, memory, time, logging, signals and exit. Collected with
/// strace over the whole guest suite (BAR and NUMA modes, server and client sockets,
/// stalls, restarts), plus exit and signal paths. Calls narrowed by their arguments are in
/// `narrowed`.
const COMMON: &[i64] = &[
    libc::SYS_accept4,
    libc::SYS_recvmsg,
    // recv() on the control channel's stream sockets
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_close,
    libc::SYS_fcntl,
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_sched_yield,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_getrandom,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigreturn,
    libc::SYS_restart_syscall,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// The daemon (or worker) besides [`COMMON`].
const ALLOWED: &[i64] = &[
    // the backend channel's check, memory tables: the front-end's regions and their files
    libc::SYS_getsockopt,
    libc::SYS_pread64,
    libc::SYS_lseek,
    libc::SYS_statx,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_fstatfs,
    // event loop, kicks and calls
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
    // threads (one set per session)
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sigaltstack,
    libc::SYS_prctl,
    libc::SYS_sched_getaffinity,
    // SIGTERM handling
    libc::SYS_rt_sigtimedwait,
];

/// The supervisor's relay thread besides [`COMMON`]: it ends its worker through its
/// pidfd (and waits for it, in `narrowed`), and bounds how long a send to the front-end or
/// the worker may wait (socket timeouts).
const RELAY: &[i64] = &[libc::SYS_pidfd_send_signal, libc::SYS_setsockopt];

/// Paths the daemon may remove under the filter, by address (see the module comment).
static REMOVABLE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Fixes `path` in memory for [`remove`] and allows its removal under the filter (call
/// before [`apply`]). Returns it for [`remove`].
pub fn removable(path: &Path) -> Option<&'static CStr> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let c: &'static CStr = Box::leak(c.into_boxed_c_str());
    REMOVABLE.lock().ok()?.push(c.as_ptr() as usize);
    Some(c)
}

/// Removes a path made [`removable`] (async-signal-safe: one system call).
pub fn remove(path: &'static CStr) {
    // SAFETY: unlink(2) with a valid, static C string; the very pointer the filter allows.
    unsafe { libc::syscall(libc::SYS_unlink, path.as_ptr()) };
}

/// Why a seccomp filter cannot be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("seccomp: {0}")]
    Rule(#[from] seccompiler::BackendError),
    #[error("seccomp: unsupported architecture: {0:?}")]
    Arch(seccompiler::BackendError),
    #[error("seccomp: {0}")]
    Install(#[from] seccompiler::Error),
    #[error("seccomp: cannot install the SIGSYS handler")]
    Handler,
}

fn cond(arg: u8, len: Len, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    Ok(SeccompCondition::new(arg, len, op, value)?)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SandboxError> {
    Ok(SeccompRule::new(conds)?)
}

/// The calls allowed only with some arguments.
fn narrowed(profile: Profile) -> Result<Vec<(i64, Vec<SeccompRule>)>, SandboxError> {
    use SeccompCmpOp::{Eq, MaskedEq};
    let no_exec = || -> Result<Vec<SeccompRule>, SandboxError> {
        Ok(vec![rule(vec![cond(
            2,
            Len::Dword,
            MaskedEq(libc::PROT_EXEC as u64),
            0,
        )?])?])
    };
    let mut v = vec![
        (libc::SYS_mmap, no_exec()?),
        (libc::SYS_mprotect, no_exec()?),
        // send() on the control channel's connected sockets: never to an address.
        (
            libc::SYS_sendto,
            vec![rule(vec![cond(4, Len::Qword, Eq, 0)?])?],
        ),
    ];
    if profile.connects {
        let unix_stream = vec![
            cond(0, Len::Dword, Eq, libc::AF_UNIX as u64)?,
            cond(1, Len::Dword, MaskedEq(0xf), libc::SOCK_STREAM as u64)?,
        ];
        v.push((libc::SYS_socket, vec![rule(unix_stream)?]));
        v.push((libc::SYS_connect, Vec::new()));
    }
    if profile.relay {
        // The worker's exit, through its pidfd only.
        let pidfd = cond(0, Len::Dword, Eq, libc::P_PIDFD as u64)?;
        v.push((libc::SYS_waitid, vec![rule(vec![pidfd])?]));
        return Ok(v);
    }
    let ioctls = [libc::FIONBIO, libc::TCGETS]
        .into_iter()
        .map(|req| rule(vec![cond(1, Len::Dword, Eq, req)?]))
        .collect::<Result<Vec<_>, _>>()?;
    v.push((libc::SYS_ioctl, ioctls));
    let threads = (libc::CLONE_THREAD | libc::CLONE_VM | libc::CLONE_SIGHAND) as u64;
    v.push((
        libc::SYS_clone,
        vec![rule(vec![cond(
            0,
            Len::Qword,
            MaskedEq(threads),
            threads,
        )?])?],
    ));
    let paths = REMOVABLE.lock().map(|p| p.clone()).unwrap_or_default();
    if !paths.is_empty() {
        let rules = paths
            .into_iter()
            .map(|p| rule(vec![cond(0, Len::Qword, Eq, p as u64)?]))
            .collect::<Result<Vec<_>, _>>()?;
        v.push((libc::SYS_unlink, rules));
    }
    Ok(v)
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SandboxError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(SandboxError::Arch)?;
    let filter = SeccompFilter::new(rules, mismatch, matched, arch)?;
    Ok(filter.try_into()?)
}

/// The filters for `profile`: the allow list, and one that answers `clone3` with ENOSYS
/// (a filter takes the strictest answer of all that are installed).
fn programs(mode: Mode, profile: Profile) -> Result<Vec<BpfProgram>, SandboxError> {
    let own = if profile.relay { RELAY } else { ALLOWED };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = COMMON
        .iter()
        .chain(own)
        .map(|&nr| (nr, Vec::new()))
        .collect();
    rules.extend(narrowed(profile)?);
    let mismatch = match mode {
        Mode::Log => SeccompAction::Log,
        // SIGSYS, so the daemon can say which call was refused before it dies.
        _ => SeccompAction::Trap,
    };
    let allow = compile(rules, mismatch, SeccompAction::Allow)?;
    let enosys = SeccompAction::Errno(libc::ENOSYS as u32);
    let clone3 = compile(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        enosys,
    )?;
    // The allow list goes last: installing a filter is a system call it refuses.
    Ok(vec![clone3, allow])
}

/// Must run before the first thread starts when a filter will be applied. glibc opens files
/// lazily from malloc: /sys/devices/system/cpu/online to size its arena limit, and
/// /proc/sys/vm/overcommit_memory before shrinking a thread arena's heap. The filter refuses
/// both; with the main (brk) arena only, neither happens.
pub fn prepare(mode: Mode) {
    if mode != Mode::Off {
        // SAFETY: mallopt only sets a malloc parameter.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
}

/// Which threads a filter binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every thread of the process (and, by inheritance, threads started later).
    Process,
    /// The calling thread only (the supervisor's relay: the threads that exec workers and
    /// handle signals stay outside).
    ThisThread,
}

/// Installs the filters for `profile` on the threads of `scope`.
pub fn apply(mode: Mode, profile: Profile, scope: Scope) -> Result<(), SandboxError> {
    if mode == Mode::Off {
        return Ok(());
    }
    let progs = programs(mode, profile)?;
    install_sigsys_reporter()?;
    for p in &progs {
        match scope {
            Scope::Process => seccompiler::apply_filter_all_threads(p),
            Scope::ThisThread => seccompiler::apply_filter(p),
        }?;
    }
    Ok(())
}

/// Writes "seccomp refused system call N" and exits: a refused call is a daemon bug (a
/// missing entry in ALLOWED) or an exploit attempt, and either way it must not go on.
extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // The kernel's siginfo for SIGSYS: after signo, errno, code and padding (16 bytes)
    // come the call address (8 bytes) and the system call number (int).
    // SAFETY: `info` is the kernel-provided siginfo of this SIGSYS, at least 128 bytes.
    let nr = unsafe { std::ptr::read_unaligned((info as *const u8).add(24) as *const i32) };
    let mut msg = *b"cxl-accel: seccomp refused system call           \n";
    let mut n = nr.unsigned_abs();
    let mut i = msg.len() - 2;
    loop {
        msg[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 39 {
            break;
        }
        i -= 1;
    }
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is valid.
    unsafe {
        libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
        libc::_exit(31);
    }
}

fn install_sigsys_reporter() -> Result<(), SandboxError> {
    if !install_handler(libc::SIGSYS, on_sigsys) {
        return Err(SandboxError::Handler);
    }
    Ok(())
}

/// A signal handler with its siginfo.
pub type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Installs `handler` for `sig` (SA_SIGINFO); false when the kernel refused. The handler
/// must only make async-signal-safe calls.
pub fn install_handler(sig: libc::c_int, handler: Handler) -> bool {
    // SAFETY: a zeroed sigaction is valid; the handler has the SA_SIGINFO signature and,
    // by this function's contract, only makes async-signal-safe calls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_and_lists_no_dangerous_calls() {
        for relay in [false, true] {
            for connects in [false, true] {
                assert!(programs(Mode::Enforce, Profile { connects, relay }).is_ok());
            }
        }
        for nr in [
            libc::SYS_execve,
            libc::SYS_open,
            libc::SYS_openat,
            libc::SYS_ptrace,
            libc::SYS_fork,
            libc::SYS_kill,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_ioctl,
            libc::SYS_mmap,
            libc::SYS_mprotect,
            libc::SYS_clone,
            libc::SYS_unlink,
            libc::SYS_unlinkat,
        ] {
            assert!(
                !ALLOWED.contains(&nr),
                "{nr} must not be allowed unconditionally"
            );
            assert!(
                !RELAY.contains(&nr),
                "{nr} must not be allowed to the relay"
            );
        }
        for nr in [libc::SYS_clone3, libc::SYS_epoll_wait, libc::SYS_eventfd2] {
            assert!(
                !RELAY.contains(&nr),
                "{nr} must not be allowed to the relay"
            );
        }
    }

    /// Runs `call` in a forked child under the filters for `profile`: whether the filters
    /// let it through (the child exits 0 or with the call's verdict) or refused it (the
    /// SIGSYS reporter exits 31).
    fn verdict(profile: Profile, call: fn() -> i32) -> i32 {
        let progs = programs(Mode::Enforce, profile).unwrap();
        // SAFETY: the child makes only system calls (sigaction, prctl, seccomp, the call
        // under test, _exit) on data prepared before the fork; the parent waits for it.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                // The reporter's message is expected here; keep it out of the test output.
                libc::close(2);
                if install_sigsys_reporter().is_err()
                    || progs.iter().any(|p| seccompiler::apply_filter(p).is_err())
                {
                    libc::_exit(99);
                }
                libc::_exit(call());
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            assert!(libc::WIFEXITED(status), "{status:#x}");
            libc::WEXITSTATUS(status)
        }
    }

    const REFUSED: i32 = 31;

    /// A new anonymous page with protection `prot`.
    fn map(prot: i32) -> *mut libc::c_void {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a new anonymous mapping; no existing memory is involved.
        unsafe { libc::mmap(std::ptr::null_mut(), 4096, prot, flags, -1, 0) }
    }

    #[test]
    fn arguments_narrow_what_the_daemon_may_do() {
        let daemon = Profile::default();
        let client = Profile {
            connects: true,
            relay: false,
        };
        let relay = Profile {
            connects: false,
            relay: true,
        };
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let inet = || unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0).min(0) + 1 };
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let unix = || unsafe { (libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) < 0) as i32 };
        assert_eq!(verdict(client, inet), REFUSED);
        assert_eq!(verdict(client, unix), 0);
        assert_eq!(verdict(daemon, unix), REFUSED);
        let exec = || (map(libc::PROT_READ | libc::PROT_EXEC) == libc::MAP_FAILED) as i32;
        let data = || (map(libc::PROT_READ | libc::PROT_WRITE) == libc::MAP_FAILED) as i32;
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let to_exec = || unsafe {
            libc::mprotect(
                map(libc::PROT_READ),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
            )
            .min(0)
                + 1
        };
        assert_eq!(verdict(daemon, exec), REFUSED);
        assert_eq!(verdict(daemon, to_exec), REFUSED);
        assert_eq!(verdict(daemon, data), 0);
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let nonblocking = || unsafe {
            let mut on: libc::c_int = 1;
            libc::ioctl(0, libc::FIONBIO, &mut on);
            0
        };
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let other_ioctl = || unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            libc::ioctl(0, libc::TIOCGWINSZ, &mut ws);
            0
        };
        assert_eq!(verdict(daemon, nonblocking), 0);
        assert_eq!(verdict(daemon, other_ioctl), REFUSED);
        // A process (fork) is refused; clone3 answers ENOSYS so glibc uses clone.
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let fork = || unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) as i32 };
        assert_eq!(verdict(daemon, fork), REFUSED);
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let clone3 = || unsafe {
            let r = libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize);
            (r != -1 || *libc::__errno_location() != libc::ENOSYS) as i32
        };
        assert_eq!(verdict(daemon, clone3), 0);
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let unlink =
            || unsafe { libc::syscall(libc::SYS_unlink, c"/nonexistent".as_ptr()) as i32 + 1 };
        assert_eq!(verdict(daemon, unlink), REFUSED);
        // The relay: no event loop, no files, its worker's exit only through a pidfd.
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let epoll = || unsafe { libc::epoll_create1(0).min(0) + 1 };
        assert_eq!(verdict(relay, epoll), REFUSED);
        assert_eq!(verdict(relay, unix), REFUSED);
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let wait_pid = || unsafe {
            let mut i: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, 1, &mut i, libc::WEXITED | libc::WNOHANG);
            0
        };
        // SAFETY: a plain system call on constants or our own stack, as the test intends.
        let wait_pidfd = || unsafe {
            let mut i: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PIDFD, 1000, &mut i, libc::WEXITED | libc::WNOHANG);
            0
        };
        assert_eq!(verdict(relay, wait_pid), REFUSED);
        assert_eq!(verdict(relay, wait_pidfd), 0);
    }
}
