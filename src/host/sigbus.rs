// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Memory we were given can shrink under us: a front-end may truncate the memfd behind
//! guest RAM after the memory-table check, QEMU holds our device-memory file open read-write
//! and could truncate it too. Touching a mapped page past the end of its file raises SIGBUS,
//! which would kill the daemon (and with it every command of the guest).
//!
//! Neither sealing nor checking can rule that out: memory-backend-file regions (hugetlbfs,
//! `/dev/shm` files, our own and our peers' BARs) cannot be sealed, and a check is stale
//! the moment after it is made. So every mapping the daemon was given is registered here,
//! and a SIGBUS handler recovers from a fault inside one: it maps a private anonymous zero
//! page (a huge page for hugetlbfs) over the faulting page and returns, so the access is
//! retried and completes on memory of our own (writes are lost, reads see zeros), and it
//! counts the fault for its thread. The command that saw a fault is answered with an
//! error ([`faults`] is compared before and after). No unwinding or jumping out of Rust code is
//! involved: the interrupted instruction simply runs again. A SIGBUS anywhere else (or of
//! another kind, such as a hardware memory error) takes its default action.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

/// Mappings registered at once: guest memory regions (at most 32 per table, kept while a
/// command uses an old table) and device memory.
const SLOTS: usize = 512;

struct Slot {
    start: AtomicUsize,
    /// 0: free. Written last when a slot is filled and first when it is emptied.
    len: AtomicUsize,
    page: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    page: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// Serialises registration (the handler only reads).
static WRITERS: Mutex<()> = Mutex::new(());
static INSTALL: Once = Once::new();

thread_local! {
    /// Faults recovered on this thread. Constant-initialised and without a destructor, so
    /// the handler's access is a plain thread-local load and store.
    static FAULTS: Cell<u64> = const { Cell::new(0) };
}

/// Faults recovered so far on the calling thread (a command runs on one thread).
pub fn faults() -> u64 {
    FAULTS.with(|f| f.get())
}

/// A registered mapping; unregistered when dropped, which must happen before it is
/// unmapped (hold it next to the mapping).
#[derive(Debug)]
pub struct Guard(usize);

impl Drop for Guard {
    fn drop(&mut self) {
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        TABLE[self.0].len.store(0, Ordering::Release);
    }
}

/// Every slot for a mapping is taken.
#[derive(Debug, thiserror::Error)]
#[error("more than {SLOTS} memory regions in use")]
pub struct TableFull;

/// Registers `len` bytes mapped at `start` from the file `fd`: a fault there is
/// recovered. Fails only when every slot is taken.
pub fn register(start: *const u8, len: usize, fd: std::os::fd::RawFd) -> Result<Guard, TableFull> {
    INSTALL.call_once(install);
    let page = page_size(fd);
    let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = TABLE
        .iter()
        .position(|s| s.len.load(Ordering::Acquire) == 0)
    else {
        return Err(TableFull);
    };
    TABLE[i].start.store(start as usize, Ordering::Relaxed);
    TABLE[i].page.store(page, Ordering::Relaxed);
    TABLE[i].len.store(len, Ordering::Release);
    Ok(Guard(i))
}

/// The page size of mappings of `fd`: the huge page size on hugetlbfs, else 4 KiB.
fn page_size(fd: std::os::fd::RawFd) -> usize {
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    // SAFETY: statfs is plain data; fstatfs fills it for a descriptor we were given.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::fstatfs(fd, &mut st) == 0 && st.f_type == HUGETLBFS_MAGIC && st.f_bsize > 0 {
            return st.f_bsize as usize;
        }
    }
    4096
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // The kernel's siginfo for SIGBUS: signo, errno, code (ints), padding, then the address.
    // SAFETY: `info` is the kernel-provided siginfo of this SIGBUS, at least 128 bytes.
    let (code, addr) = unsafe {
        let p = info as *const u8;
        (
            std::ptr::read_unaligned(p.add(8) as *const i32),
            std::ptr::read_unaligned(p.add(16) as *const usize),
        )
    };
    const BUS_ADRERR: i32 = 2;
    if code == BUS_ADRERR {
        for s in TABLE.iter() {
            let len = s.len.load(Ordering::Acquire);
            let start = s.start.load(Ordering::Relaxed);
            if len == 0 || addr < start || addr - start >= len {
                continue;
            }
            let page = s.page.load(Ordering::Relaxed).max(4096);
            let base = (addr & !(page - 1)).max(start);
            let size = page.min(start + len - base);
            // SAFETY: replaces pages of a mapping we registered (and still hold) with
            // private anonymous memory of the same size; mmap is a plain system call.
            let p = unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                FAULTS.with(|f| f.set(f.get() + 1));
                return;
            }
            break;
        }
    }
    // Not memory we were given: the default action, when the access is retried.
    // SAFETY: a zeroed sigaction with SIG_DFL is valid; sigaction is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

fn install() {
    // The handler only makes async-signal-safe calls (atomics, mmap, sigaction).
    if !crate::host::sandbox::install_handler(libc::SIGBUS, on_sigbus) {
        log::error!("cannot install the SIGBUS handler: shrunk memory will kill the daemon");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_truncated_mapping_reads_zeros_instead_of_killing() {
        let name = std::ffi::CString::new("sigbus-test").unwrap();
        // SAFETY: memfd_create with a valid name; the fd is owned by the File.
        let file = unsafe {
            use std::os::fd::FromRawFd;
            std::fs::File::from_raw_fd(libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC))
        };
        let len = 64 << 10;
        file.set_len(len as u64).unwrap();
        let map = vm_memory::MmapRegion::<()>::from_file(
            vm_memory::FileOffset::new(file.try_clone().unwrap(), 0),
            len,
        )
        .unwrap();
        let _g = register(map.as_ptr(), len, file.as_raw_fd()).unwrap();
        file.set_len(4096).unwrap();
        let before = faults();
        let slice = vm_memory::VolatileMemory::get_slice(&map, 32 << 10, 8).unwrap();
        let mut buf = [1u8; 8];
        vm_memory::Bytes::read_slice(&slice, &mut buf, 0).unwrap();
        assert_eq!(buf, [0; 8]);
        assert!(faults() > before);
        // Writes land too, and stay in our own page.
        vm_memory::Bytes::write_slice(&slice, &[7; 8], 0).unwrap();
        vm_memory::Bytes::read_slice(&slice, &mut buf, 0).unwrap();
        assert_eq!(buf, [7; 8]);
    }
}
