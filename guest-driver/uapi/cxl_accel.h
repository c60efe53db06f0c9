/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * cxl-accel: user-space interface of the guest driver.
 *
 * One character device per accelerator: /dev/cxl-accel0, /dev/cxl-accel1...
 *
 * Device memory is allocated by the device (CXL_ACCEL_IOC_ALLOC) and named
 * by a per-file handle. mmap() of a buffer (MAP_SHARED, offset =
 * cxl_accel_alloc.mmap_offset, plus a page-aligned offset into the buffer)
 * gives direct, cache-coherent CPU access: no flush or sync call is needed
 * before or after the device touches the same memory.
 *
 * Commands (COPY, FILL, CHECKSUM, ATOMIC, SIGNAL) take memory operands that
 * are either user memory (handle 0, addr = virtual address; the pages are
 * pinned for the duration of the command) or a device-memory buffer
 * (handle != 0, addr = byte offset into the buffer). Every command waits for
 * its completion; timeout_ms = 0 means the module default (module parameter
 * cmd_timeout_ms). A command that times out returns -ETIMEDOUT; its memory
 * stays pinned until the device returns it or is reset.
 *
 * Errors: -EINVAL bad argument or range outside a buffer, -EFAULT
 * unmapped user memory (or a device-reported bad address), -ENOENT unknown
 * handle, -ENOSPC device memory exhausted, -ENOMEM kernel memory, -ETIMEDOUT
 * no completion in time, -EINTR interrupted by a signal while waiting, -EIO
 * device or protocol failure, or poisoned device memory (a media error),
 * -ENODEV device removed.
 */
#ifndef _UAPI_CXL_ACCEL_H
#define _UAPI_CXL_ACCEL_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define CXL_ACCEL_IOC_MAGIC		0xCA	/* numbers 0x40-0x4F */

/* Shift of the handle in an mmap offset (mmap_offset = handle << shift). */
#define CXL_ACCEL_MMAP_SHIFT		40
/*
 * Or'ed into an mmap offset: map the buffer through the CXL region's
 * host-physical range (loads and stores over CXL.mem) instead of its device
 * memory pages. A PFN map: no struct pages behind it, so no pinning, no
 * migration, no DMA-BUF. ENXIO where the region does not reach device
 * memory (not a CXL device, or sysfs "cxl" says not-backed).
 */
#define CXL_ACCEL_MMAP_REGION		(1ULL << 39)

/* Features, same bits as the device reports */
#define CXL_ACCEL_F_ATOMIC_DEVMEM	(1ULL << 0)
#define CXL_ACCEL_F_ATOMIC_GUEST	(1ULL << 1)
#define CXL_ACCEL_F_P2P			(1ULL << 2)
#define CXL_ACCEL_F_ALLOC		(1ULL << 3)
#define CXL_ACCEL_F_COPY_PAGES		(1ULL << 4)
#define CXL_ACCEL_F_EVENTS		(1ULL << 5)
#define CXL_ACCEL_F_EXPORT		(1ULL << 6)

struct cxl_accel_identify {
	__u32 magic;
	__u16 version_major;
	__u16 version_minor;
	__u64 features;
	__u64 devmem_size;		/* bytes of device memory */
	__u64 devmem_free;		/* bytes not allocated */
	__u64 devmem_gpa;		/* guest-physical address of the memory BAR */
	__u32 num_dma_engines;
	__u32 max_segments;
	__u32 buffers;			/* live allocations, all users */
	__u32 device_index;		/* as configured on the host */
	/* CDAT-style performance attributes of device memory */
	__u32 read_latency_ns;
	__u32 write_latency_ns;
	__u32 read_bandwidth_mbs;
	__u32 write_bandwidth_mbs;
	__u32 page_size;
	__u32 max_request;
	__u32 minor;			/* N of /dev/cxl-accelN */
	__s32 numa_node;
	__u64 reserved[4];
};

struct cxl_accel_alloc {
	__u64 size;			/* in: bytes, rounded up to the page size */
	__u64 align;			/* in: power of two, 0 = page size */
	__u32 flags;			/* in: 0 */
	__u32 handle;			/* out: never 0 */
	__u64 offset;			/* out: offset in device memory */
	__u64 mmap_offset;		/* out: offset argument for mmap() */
	__u64 alloc_size;		/* out: size after rounding */
};

struct cxl_accel_free {
	__u32 handle;
	__u32 flags;			/* 0 */
};

/* A memory operand */
struct cxl_accel_mem {
	__u64 addr;	/* handle 0: user virtual address, else offset in buffer */
	__u32 handle;	/* 0: user memory */
	__u32 reserved;	/* 0 */
};

/* Operation flags */
#define CXL_ACCEL_OP_FENCE		(1U << 0) /* start after earlier commands */

struct cxl_accel_copy {
	struct cxl_accel_mem src;
	struct cxl_accel_mem dst;
	__u64 len;
	__u32 flags;
	__u32 timeout_ms;
};

struct cxl_accel_fill {
	struct cxl_accel_mem dst;
	__u64 len;
	__u64 pattern;			/* byte i = byte (i % 8) of the LE pattern */
	__u32 flags;
	__u32 timeout_ms;
};

/* crc32c (Castagnoli), crc = ~crc32c_update(~seed, data) */
struct cxl_accel_checksum {
	struct cxl_accel_mem src;
	__u64 len;
	__u32 seed;			/* in */
	__u32 crc;			/* out */
	__u32 flags;
	__u32 timeout_ms;
};

#define CXL_ACCEL_ATOMIC_FETCH_ADD	0
#define CXL_ACCEL_ATOMIC_CMPXCHG	1
#define CXL_ACCEL_ATOMIC_SWAP		2

/*
 * ATOMIC flag, on a user address (handle 0): the device takes the page for
 * itself first (make_device_exclusive(): the CPU mapping becomes a
 * device-exclusive entry, a CPU access in the meantime waits, and the next
 * one takes the page back), as a device does whose link has no atomics
 * towards system memory. Needs CONFIG_DEVICE_PRIVATE (HMM_INFO flag
 * CXL_ACCEL_HMM_PRIVATE), else -EOPNOTSUPP. -EBUSY when the kernel would
 * not give the page up (before 6.15: a page of a transparent huge page).
 */
#define CXL_ACCEL_ATOMIC_EXCLUSIVE	(1U << 1)

struct cxl_accel_atomic {
	struct cxl_accel_mem target;	/* naturally aligned to width */
	__u16 op;
	__u16 width;			/* 4 or 8 */
	__u32 flags;
	__u64 operand;
	__u64 compare;			/* CMPXCHG */
	__u64 repeat;			/* FETCH_ADD: number of separate adds, 0 = 1 */
	__u64 result;			/* out: old value of the last operation */
	__u64 count;			/* out: operations done (CMPXCHG: 1 = swapped) */
	__u32 timeout_ms;
	__u32 reserved;
};

/* Ask the device to post an event carrying value (CXL_ACCEL_EVENT_SIGNAL). */
struct cxl_accel_signal {
	__u64 value;
	__u32 flags;
	__u32 timeout_ms;
};

#define CXL_ACCEL_EVENT_SIGNAL		1	/* value0 = SIGNAL value */
#define CXL_ACCEL_EVENT_ERROR		2	/* value0 = opcode, value1 = status */
#define CXL_ACCEL_EVENT_DEVMEM_MAPPED	3	/* value0 = gpa of device memory */
/*
 * Media errors: value0 = offset, value1 = length of device memory that
 * became poisoned (or usable again). While a range is poisoned, commands
 * that touch it fail with -EIO and CPU accesses through a buffer or
 * DMA-BUF mapping get SIGBUS (BUS_MCEERR_AR); sysfs "poison" lists the
 * ranges the driver knows of.
 */
#define CXL_ACCEL_EVENT_POISON		4
#define CXL_ACCEL_EVENT_POISON_CLEARED	5

struct cxl_accel_event {
	__u32 type;
	__u32 reserved;
	__u64 seq;
	__u64 value0;
	__u64 value1;
};

/*
 * Wait for the next event of this file (each open file sees every event
 * posted after it was opened). Events that do not match type (0 = any) or
 * value (with CXL_ACCEL_WAIT_MATCH_VALUE) are consumed and skipped.
 * timeout_ms = 0: do not sleep (-EAGAIN if nothing is pending).
 */
#define CXL_ACCEL_WAIT_MATCH_VALUE	(1U << 0)

struct cxl_accel_wait_event {
	__u32 type;			/* in */
	__u32 flags;			/* in */
	__u64 value;			/* in */
	__u32 timeout_ms;		/* in */
	__u32 lost;			/* out: events overwritten before read */
	struct cxl_accel_event event;	/* out */
};

/*
 * One NOP command: the device round trip alone, for latency measurements
 * and liveness checks.
 */
struct cxl_accel_nop {
	__u32 flags;			/* in: CXL_ACCEL_OP_FENCE or 0 */
	__u32 timeout_ms;		/* in: 0 = default */
};

/* Driver counters (cxl_accel_stats.driver[]) */
#define CXL_ACCEL_DSTAT_SUBMITTED	0
#define CXL_ACCEL_DSTAT_COMPLETED	1
#define CXL_ACCEL_DSTAT_ERRORS		2	/* device error status */
#define CXL_ACCEL_DSTAT_TIMEOUTS	3
#define CXL_ACCEL_DSTAT_INTERRUPTED	4
#define CXL_ACCEL_DSTAT_QUARANTINED	5	/* abandoned, still at the device */
#define CXL_ACCEL_DSTAT_PROTOCOL	6	/* malformed responses */
#define CXL_ACCEL_DSTAT_EVENTS		7
#define CXL_ACCEL_DSTAT_BUFFERS		8	/* live buffers */
#define CXL_ACCEL_DSTAT_EXCLUSIVE	9	/* exclusive device atomics (ATOMIC_EXCLUSIVE) */
#define CXL_ACCEL_DSTAT_POISON		10	/* POISON events handled */
#define CXL_ACCEL_DSTAT_HWPOISON	11	/* CPU faults on poisoned pages (SIGBUS) */
#define CXL_ACCEL_DSTAT_POLLED		12	/* waits that found the completion by polling */
#define CXL_ACCEL_DSTAT_SLEPT		13	/* waits that slept until the interrupt */
#define CXL_ACCEL_DSTAT_COUNT		16

/* Device counters (cxl_accel_stats.device[]) */
#define CXL_ACCEL_STAT_COMMANDS		0
#define CXL_ACCEL_STAT_ERRORS		1
#define CXL_ACCEL_STAT_BYTES_COPIED	2
#define CXL_ACCEL_STAT_BYTES_P2P	3
#define CXL_ACCEL_STAT_BYTES_FILLED	4
#define CXL_ACCEL_STAT_BYTES_CHECKSUMMED 5
#define CXL_ACCEL_STAT_ATOMIC_OPS	6
#define CXL_ACCEL_STAT_PAGES_COPIED	7
#define CXL_ACCEL_STAT_EVENTS_SENT	8
#define CXL_ACCEL_STAT_EVENTS_DROPPED	9
#define CXL_ACCEL_STAT_MEDIA_ERRORS	10	/* commands that met poisoned memory */
#define CXL_ACCEL_STAT_COUNT		16

struct cxl_accel_stats {
	__u64 device[CXL_ACCEL_STAT_COUNT];
	__u64 driver[CXL_ACCEL_DSTAT_COUNT];
};

#define CXL_ACCEL_IOC_IDENTIFY	_IOR(CXL_ACCEL_IOC_MAGIC, 0x40, struct cxl_accel_identify)
#define CXL_ACCEL_IOC_ALLOC	_IOWR(CXL_ACCEL_IOC_MAGIC, 0x41, struct cxl_accel_alloc)
#define CXL_ACCEL_IOC_FREE	_IOW(CXL_ACCEL_IOC_MAGIC, 0x42, struct cxl_accel_free)
#define CXL_ACCEL_IOC_COPY	_IOW(CXL_ACCEL_IOC_MAGIC, 0x43, struct cxl_accel_copy)
#define CXL_ACCEL_IOC_FILL	_IOW(CXL_ACCEL_IOC_MAGIC, 0x44, struct cxl_accel_fill)
#define CXL_ACCEL_IOC_CHECKSUM	_IOWR(CXL_ACCEL_IOC_MAGIC, 0x45, struct cxl_accel_checksum)
#define CXL_ACCEL_IOC_ATOMIC	_IOWR(CXL_ACCEL_IOC_MAGIC, 0x46, struct cxl_accel_atomic)
#define CXL_ACCEL_IOC_SIGNAL	_IOW(CXL_ACCEL_IOC_MAGIC, 0x47, struct cxl_accel_signal)
#define CXL_ACCEL_IOC_WAIT_EVENT _IOWR(CXL_ACCEL_IOC_MAGIC, 0x48, struct cxl_accel_wait_event)
#define CXL_ACCEL_IOC_STATS	_IOR(CXL_ACCEL_IOC_MAGIC, 0x49, struct cxl_accel_stats)
#define CXL_ACCEL_IOC_NOP	_IOW(CXL_ACCEL_IOC_MAGIC, 0x4a, struct cxl_accel_nop)

/*
 * DMA-BUF export and import (ioctl numbers 0x60-0x6F).
 *
 * EXPORT_DMABUF makes a buffer of this file a DMA-BUF file descriptor. The
 * DMA-BUF keeps the buffer alive: FREE of the handle, close of this file
 * and exit do not free the device memory while the DMA-BUF, a mapping of
 * it or an importer lives. The fd supports mmap() (MAP_SHARED, coherent
 * like the mmap of the handle; DMA_BUF_IOCTL_SYNC is accepted and not
 * needed), lseek(SEEK_END) for the size, and passing to other processes.
 * Each buffer has one DMA-BUF: exporting it again gives another fd of the
 * same DMA-BUF, with the same UUID. The UUID is told to the device
 * (EXPORT); it is the name of the buffer outside the guest.
 *
 * IMPORT_DMABUF takes any DMA-BUF fd (another cxl-accel device's, this
 * device's own, udmabuf, a DMA heap, ...) and returns a handle with
 * CXL_ACCEL_HANDLE_IMPORTED set. That handle is a memory operand of COPY,
 * FILL, CHECKSUM and ATOMIC like a buffer handle (addr = byte offset in the
 * DMA-BUF); FREE releases it. The import holds the DMA-BUF: closing the
 * exporter's fd does not end it. Memory of another cxl-accel device is
 * reached peer-to-peer, by bus address, without a copy through system RAM.
 *
 * When the exporting device is removed (unbind), its DMA-BUFs are revoked:
 * their mappings are zapped (SIGBUS), and commands on imports of them fail
 * with -ENODEV, as do new imports and DMA_BUF_IOCTL_SYNC. The fds stay
 * valid until closed. The module cannot be unloaded while a DMA-BUF it
 * exported lives (each one holds a module reference).
 *
 * Errors: -EBADF fd is not open, -EINVAL fd is not a DMA-BUF (or bad
 * flags, reserved fields, offsets or sizes), -ENOENT unknown handle,
 * -ENODEV device or exporter removed, -EOPNOTSUPP device without EXPORT
 * (export) or an IOMMU translating for the device (import).
 */
#define CXL_ACCEL_DMABUF_CLOEXEC	(1U << 0) /* export: fd gets FD_CLOEXEC */

struct cxl_accel_dmabuf_export {
	__u32 handle;			/* in: buffer handle */
	__u32 flags;			/* in: CXL_ACCEL_DMABUF_* */
	__s32 fd;			/* out: DMA-BUF file descriptor */
	__u32 reserved;			/* 0 */
	__u64 size;			/* out: bytes */
	__u8 uuid[16];			/* out: UUID of the exported buffer */
};

/* Set in every handle of an imported DMA-BUF */
#define CXL_ACCEL_HANDLE_IMPORTED	(1U << 31)

/* cxl_accel_dmabuf_import.kind: who exported the DMA-BUF */
#define CXL_ACCEL_IMPORT_SELF		1	/* this device (its own memory) */
#define CXL_ACCEL_IMPORT_PEER		2	/* another cxl-accel device */
#define CXL_ACCEL_IMPORT_OTHER		3	/* another exporter (system memory) */

/* cxl_accel_dmabuf_import.attach_flags */
#define CXL_ACCEL_IMPORT_P2P		(1U << 0) /* exporter gave bus addresses: peer-to-peer */
#define CXL_ACCEL_IMPORT_DYNAMIC	(1U << 1) /* exporter may move or revoke it */

struct cxl_accel_dmabuf_import {
	__s32 fd;			/* in: DMA-BUF file descriptor */
	__u32 flags;			/* in: 0 */
	__u32 handle;			/* out: operand handle, CXL_ACCEL_HANDLE_IMPORTED set */
	__u32 kind;			/* out: CXL_ACCEL_IMPORT_SELF/PEER/OTHER */
	__u64 size;			/* out: bytes */
	__u8 uuid[16];			/* out: exporter's UUID (virtio DMA-BUFs), else 0 */
	__u32 attach_flags;		/* out: CXL_ACCEL_IMPORT_P2P, _DYNAMIC */
	__u32 nr_segments;		/* out: DMA segments of the mapping */
	__u64 reserved[2];		/* 0 */
};

#define CXL_ACCEL_IOC_EXPORT_DMABUF _IOWR(CXL_ACCEL_IOC_MAGIC, 0x60, struct cxl_accel_dmabuf_export)
#define CXL_ACCEL_IOC_IMPORT_DMABUF _IOWR(CXL_ACCEL_IOC_MAGIC, 0x61, struct cxl_accel_dmabuf_import)
/* end of the DMA-BUF block */

/*
 * Page migration and shared virtual memory (HMM): ioctl numbers 0x50-0x5F.
 *
 * MIGRATE_TO_DEV moves the private anonymous pages of [addr, addr + len) of
 * the calling process into this device's memory; holes of anonymous
 * memory get zero-filled device pages. The pages stay mapped at the same
 * addresses (MEMORY_DEVICE_COHERENT): the CPU keeps reading and writing
 * them in place, without faults. MIGRATE_TO_RAM moves every page of the
 * range that lies on the memory of any cxl-accel device back to system
 * RAM. The data is copied by the device's DMA engine (COPY_PAGES, FILL),
 * from a peer device's memory peer-to-peer. Pages that cannot move are
 * counted, not failed: shared mappings (MAP_SHARED, shmem), page-cache
 * pages of file mappings, KSM pages, mappings without access, special
 * mappings and hugetlbfs are refused; pinned pages and pages another migration holds
 * are busy. The range must be mapped (else -EFAULT); THP is split first.
 *
 * EVICT moves every page of this device's memory that a process maps back
 * to system RAM, whoever it is (pages only a pipe or a pin still holds stay
 * and are counted as remaining), and returns
 * the pool's device buffers to the device. Unbind and module unload do the
 * same: no process data is left on a device that goes away.
 *
 * SVM lets the device read and write the calling process's virtual memory
 * directly, any alignment: the pages are resolved with hmm_range_fault()
 * (faulting them in like a CPU access would, with the same permission
 * checks) and kept in a device mirror per (file, process), invalidated by
 * an mmu_interval_notifier on munmap, mprotect, COW, migration, reclaim
 * and exit. An invalidation waits for device accesses in flight to its
 * range. Errors: -EFAULT unmapped or no access, -EPERM write to read-only
 * memory, -EBUSY the range kept changing (retries exhausted).
 *
 * SNAPSHOT reports one CXL_ACCEL_SNAP_* byte per page of the calling
 * process's range, without faulting anything in. PIN_CHECKSUM pins a range
 * with FOLL_LONGTERM (which moves device pages to RAM first) and lets the
 * device checksum it. HMM_INFO reports the migration pool and counters.
 */
#define CXL_ACCEL_F_NUMA		(1ULL << 7) /* device memory is a NUMA node */

/*
 * MIGRATE_TO_DEV / MIGRATE_TO_RAM flag: device-private pages instead of
 * coherent ones (HMM_INFO flag CXL_ACCEL_HMM_PRIVATE): to the device, the
 * pages become MEMORY_DEVICE_PRIVATE (a CPU access faults them back to RAM
 * through the device); to RAM, this device's private pages come back.
 */
#define CXL_ACCEL_MIGRATE_PRIVATE	(1U << 0)

struct cxl_accel_migrate {
	__u64 addr;			/* in: page aligned */
	__u64 len;			/* in: bytes, page multiple, > 0 */
	__u32 flags;			/* in: CXL_ACCEL_MIGRATE_PRIVATE or 0 */
	__u32 timeout_ms;		/* in: per device command, 0 = default */
	__u64 migrated;			/* out: pages moved by this call */
	__u64 already;			/* out: already there (to RAM: not on device, or busy) */
	__u64 refused;			/* out: pages that cannot move (see above) */
	__u64 busy;			/* out: pinned, locked, racing, or copy failed */
	__u64 no_space;			/* out: left behind, device memory full */
	__u64 poisoned;			/* out: of busy, on poisoned device memory */
	__u64 reserved[2];		/* 0 */
};

struct cxl_accel_evict {
	__u32 flags;			/* in: 0 */
	__u32 timeout_ms;		/* in: per device command, 0 = default */
	__u64 evicted;			/* out: pages moved back to system RAM */
	__u64 remaining;		/* out: pages still on device memory (pinned) */
	__u64 chunks_freed;		/* out: pool buffers returned to the device */
	__u64 poisoned;			/* out: pages left on poisoned device memory */
	__u64 reserved[3];		/* 0 */
};

#define CXL_ACCEL_HMM_COHERENT		(1U << 0) /* ZONE_DEVICE coherent pages: migration ioctls */
#define CXL_ACCEL_HMM_NUMA		(1U << 1) /* device memory is a CPU-less NUMA node */
#define CXL_ACCEL_HMM_PRIVATE		(1U << 2) /* MEMORY_DEVICE_PRIVATE pages too */

struct cxl_accel_hmm_info {
	__u32 flags;			/* CXL_ACCEL_HMM_* */
	__s32 numa_node;		/* node of device memory (NUMA mode), else -1 */
	__u64 mem_start;		/* guest-physical range of device memory */
	__u64 mem_size;
	__u64 chunk_size;		/* bytes of one pool buffer */
	__u64 pool_chunks;		/* pool buffers held now */
	__u64 pool_pages_used;		/* pool pages holding process data */
	__u64 pool_pages_free;
	__u64 migrated_to_dev;		/* pages since probe */
	__u64 migrated_to_ram;
	__u64 evicted;			/* by EVICT or removal */
	__u64 cpu_evicted;		/* of those, copied by the CPU (device dead) */
	__u64 copy_commands;		/* COPY_PAGES and FILL commands of migrations */
	__u64 copy_failures;
	__u64 svm_faults;		/* hmm_range_fault() calls */
	__u64 svm_retries;		/* -EBUSY or notifier sequence changed */
	__u64 svm_mirror_hits;		/* windows served from a mirror */
	__u64 svm_invalidations;	/* notifier callbacks that dropped entries */
	__u64 svm_invalidate_waits;	/* callbacks that waited for the device */
	__u64 svm_mirrors;		/* live mirrors (file, process) */
	__u64 private_pages;		/* private pages in use now */
	__u64 cpu_faults;		/* CPU accesses that brought one back */
	__u64 pool_pages_poisoned;	/* free pool pages held back: poisoned */
	__u64 poison_skipped;		/* pages migration left on poisoned memory */
	__u64 reserved[4];
};

#define CXL_ACCEL_SVM_READ		0 /* device copies the user range into the buffer */
#define CXL_ACCEL_SVM_WRITE		1 /* device copies the buffer into the user range */
#define CXL_ACCEL_SVM_CHECKSUM		2 /* crc32c of the user range; seed in value, crc out */
#define CXL_ACCEL_SVM_FILL		3 /* device fills the user range with the value pattern */

struct cxl_accel_svm {
	__u64 addr;			/* in: user virtual address */
	__u64 len;			/* in: bytes, > 0 */
	__u32 op;			/* in: CXL_ACCEL_SVM_* */
	__u32 handle;			/* in: READ/WRITE: device buffer */
	__u64 offset;			/* in: READ/WRITE: byte offset in the buffer */
	__u64 value;			/* in: FILL pattern, CHECKSUM seed; out: crc */
	__u32 flags;			/* in: 0 */
	__u32 timeout_ms;		/* in: per device command, 0 = default */
	__u64 faults;			/* out: hmm_range_fault() calls */
	__u64 mirror_hits;		/* out: windows served from the mirror */
	__u64 retries;			/* out: sequence retries */
	__u64 reserved[2];		/* 0 */
};

/* SNAPSHOT: one byte per page; 0 = not present */
#define CXL_ACCEL_SNAP_PRESENT		(1U << 0) /* mapped in the CPU page table */
#define CXL_ACCEL_SNAP_WRITE		(1U << 1) /* writable, else read-only */
#define CXL_ACCEL_SNAP_ZERO		(1U << 2) /* the shared (huge) zero page */
#define CXL_ACCEL_SNAP_HUGE		(1U << 3) /* mapped by a PMD (THP) */
#define CXL_ACCEL_SNAP_LOCAL		(1U << 4) /* on this device's memory; without
						   * PRESENT: a private page */
#define CXL_ACCEL_SNAP_REMOTE		(1U << 5) /* on another cxl-accel device's memory */
#define CXL_ACCEL_SNAP_MIRRORED		(1U << 6) /* held by this file's device mirror */
#define CXL_ACCEL_SNAP_ERROR		(1U << 7) /* no access (PROT_NONE) or not mapped */

struct cxl_accel_snapshot {
	__u64 addr;			/* in: page aligned */
	__u64 len;			/* in: bytes, page multiple, at most 1 GiB */
	__u64 flags_ptr;		/* in: user buffer of len / page size bytes */
	__u32 flags;			/* in: 0 */
	__u32 reserved;			/* 0 */
};

struct cxl_accel_pin_checksum {
	__u64 addr;			/* in: user virtual address */
	__u64 len;			/* in: bytes, > 0, at most 256 MiB */
	__u32 seed;			/* in */
	__u32 crc;			/* out: crc32c */
	__u32 flags;			/* in: 0 */
	__u32 timeout_ms;		/* in: per device command, 0 = default */
	__u64 pages;			/* out: pages pinned */
	__u64 on_device;		/* out: pinned pages on cxl-accel memory (expect 0) */
	__u64 reserved[2];		/* 0 */
};

#define CXL_ACCEL_IOC_MIGRATE_TO_DEV _IOWR(CXL_ACCEL_IOC_MAGIC, 0x50, struct cxl_accel_migrate)
#define CXL_ACCEL_IOC_MIGRATE_TO_RAM _IOWR(CXL_ACCEL_IOC_MAGIC, 0x51, struct cxl_accel_migrate)
#define CXL_ACCEL_IOC_EVICT	_IOWR(CXL_ACCEL_IOC_MAGIC, 0x52, struct cxl_accel_evict)
#define CXL_ACCEL_IOC_HMM_INFO	_IOR(CXL_ACCEL_IOC_MAGIC, 0x53, struct cxl_accel_hmm_info)
#define CXL_ACCEL_IOC_SVM	_IOWR(CXL_ACCEL_IOC_MAGIC, 0x54, struct cxl_accel_svm)
#define CXL_ACCEL_IOC_SNAPSHOT	_IOW(CXL_ACCEL_IOC_MAGIC, 0x55, struct cxl_accel_snapshot)
#define CXL_ACCEL_IOC_PIN_CHECKSUM _IOWR(CXL_ACCEL_IOC_MAGIC, 0x56, struct cxl_accel_pin_checksum)
/* end of the migration / SVM block */

#endif /* _UAPI_CXL_ACCEL_H */
