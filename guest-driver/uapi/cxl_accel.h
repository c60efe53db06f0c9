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
 * device or protocol failure, -ENODEV device removed.
 */
#ifndef _UAPI_CXL_ACCEL_H
#define _UAPI_CXL_ACCEL_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define CXL_ACCEL_IOC_MAGIC		0xCA	/* numbers 0x40-0x4F */

/* Shift of the handle in an mmap offset (mmap_offset = handle << shift). */
#define CXL_ACCEL_MMAP_SHIFT		40

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

#endif /* _UAPI_CXL_ACCEL_H */
