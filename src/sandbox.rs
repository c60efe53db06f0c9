//! seccomp sandbox: after start-up the daemon needs only a short list of system calls
//! (sockets it already has, shared-memory mappings, eventfds, threads, futexes, logging).
//! Anything else — opening files, exec, ptrace, network — is refused.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

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

/// System calls the daemon makes once it serves: collected with strace over the whole
/// guest suite (BAR and NUMA modes, server and client sockets, stalls), plus exit and
/// signal paths.
const ALLOWED: &[i64] = &[
    // sessions: accepting or connecting, vhost-user messages with fds
    libc::SYS_accept4,
    libc::SYS_socket,
    libc::SYS_connect,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_getsockopt,
    libc::SYS_shutdown,
    libc::SYS_close,
    libc::SYS_fcntl,
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_lseek,
    libc::SYS_ioctl,
    // memory tables: map and unmap the front-end's regions, check their files
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
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
    libc::SYS_poll,
    libc::SYS_ppoll,
    // threads (one set per session) and their synchronisation
    libc::SYS_clone3,
    libc::SYS_clone,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sigaltstack,
    libc::SYS_prctl,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_getrandom,
    // signals and exit: SIGTERM handling, removing our socket, panics (abort)
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigreturn,
    libc::SYS_restart_syscall,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

fn program(mode: Mode) -> Result<BpfProgram, String> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    let mismatch = match mode {
        Mode::Log => SeccompAction::Log,
        // SIGSYS, so the daemon can say which call was refused before it dies.
        _ => SeccompAction::Trap,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("seccomp: unsupported architecture: {e:?}"))?;
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(|e| format!("seccomp: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))
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

/// Installs the filter on every thread of the process (and, by inheritance, on threads
/// started later).
pub fn apply(mode: Mode) -> Result<(), String> {
    if mode == Mode::Off {
        return Ok(());
    }
    let prog = program(mode)?;
    install_sigsys_reporter()?;
    seccompiler::apply_filter_all_threads(&prog).map_err(|e| format!("seccomp: {e}"))
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

fn install_sigsys_reporter() -> Result<(), String> {
    // SAFETY: a zeroed sigaction is valid; the handler has the SA_SIGINFO signature and
    // only calls async-signal-safe functions.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
            return Err("seccomp: cannot install the SIGSYS handler".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_and_lists_no_dangerous_calls() {
        assert!(program(Mode::Enforce).is_ok());
        for nr in [
            libc::SYS_execve,
            libc::SYS_open,
            libc::SYS_openat,
            libc::SYS_ptrace,
            libc::SYS_fork,
            libc::SYS_kill,
        ] {
            assert!(!ALLOWED.contains(&nr), "{nr} must not be allowed");
        }
    }
}
