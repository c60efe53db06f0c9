/* SPDX-License-Identifier: (GPL-2.0 OR BSD-3-Clause) */
/*
 * cxl-accel device wire format: virtio config space, command queue
 * requests and responses, event queue records.
 *
 * This header is the C side of the single definition of the protocol
 * spoken between the cxl-accel daemon (Rust, src/protocol.rs) and the
 * guest driver. tests/wire_format.rs compiles a program against this
 * file and checks every size, offset and constant against the Rust
 * definitions. See docs/device-spec.md for the semantics.
 *
 * All multi-byte fields are little-endian.
 */
#ifndef CXL_ACCEL_PROTO_H
#define CXL_ACCEL_PROTO_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <stdint.h>
typedef uint8_t __u8;
typedef uint16_t __le16;
typedef uint32_t __le32;
typedef uint64_t __le64;
#endif

/* Virtio device ID: "signal distribution", assigned by the virtio spec but
 * implemented by neither Linux nor QEMU, so nothing else binds to it.
 */
#define CXLA_VIRTIO_ID			21

#define CXLA_MAGIC			0x414c5843	/* "CXLA" */
#define CXLA_VERSION_MAJOR		1
#define CXLA_VERSION_MINOR		1

/* Queues */
#define CXLA_QUEUE_CMD			0
#define CXLA_QUEUE_EVENT		1
#define CXLA_NUM_QUEUES			2	/* of a version 1.0 device */
/*
 * Version 1.1: num_cmd_queues command queues (config), command queue k at
 * virtqueue 0 for k = 0, else at virtqueue k + 1 (after the event queue).
 */
#define CXLA_MAX_CMD_QUEUES		8

/* Device feature bits (config.features) */
#define CXLA_F_ATOMIC_DEVMEM		(1ULL << 0)
#define CXLA_F_ATOMIC_GUEST		(1ULL << 1)
#define CXLA_F_P2P			(1ULL << 2)
#define CXLA_F_ALLOC			(1ULL << 3)
#define CXLA_F_COPY_PAGES		(1ULL << 4)
#define CXLA_F_EVENTS			(1ULL << 5)
#define CXLA_F_EXPORT			(1ULL << 6)
#define CXLA_F_NUMA			(1ULL << 7)	/* memory is a CPU-less NUMA node, not a BAR */
#define CXLA_F_SHMEM			(1ULL << 8)	/* memory is virtio shared memory region CXLA_SHM_ID_DEVMEM */
#define CXLA_F_CXL			(1ULL << 9)	/* a CXL Type-2 endpoint: CXL DVSECs, component registers */

/* The virtio shared memory region id (shmid) of device memory (CXLA_F_SHMEM) */
#define CXLA_SHM_ID_DEVMEM		0

/* Limits */
#define CXLA_MAX_SEGMENTS		4096	/* per scatter-gather list */
#define CXLA_MAX_PAGES			4096	/* per COPY_PAGES */
#define CXLA_MAX_REQUEST		(256 * 1024) /* readable bytes per request */
#define CXLA_MAX_RESPONSE_SEGMENTS	64	/* writable descriptors per request */
#define CXLA_MAX_TRANSFER		(1ULL << 30) /* bytes moved by one command */
#define CXLA_MAX_ATOMIC_REPEAT		(1ULL << 27) /* ATOMIC FETCH_ADD repeat */

/* Virtio config space (read-only for the driver), 64 bytes */
struct cxla_config {
	__le32 magic;
	__le16 version_major;
	__le16 version_minor;
	__le64 features;
	__le64 devmem_size;
	__le32 num_dma_engines;
	__le32 max_segments;
	/* CDAT-style performance attributes of device memory */
	__le32 read_latency_ns;
	__le32 write_latency_ns;
	__le32 read_bandwidth_mbs;
	__le32 write_bandwidth_mbs;
	__le32 device_index;
	__le32 page_size;
	__le32 max_request;
	__le32 num_cmd_queues;	/* 1.1; 0 (a 1.0 device) means 1 */
};

/* Address spaces of a scatter-gather entry or an address */
#define CXLA_SPACE_GPA			0	/* guest-physical (RAM or a peer's BAR) */
#define CXLA_SPACE_DEVMEM		1	/* offset into this device's memory */

/* Opcodes */
#define CXLA_OP_NOP			0x00
#define CXLA_OP_IDENTIFY		0x01
#define CXLA_OP_SET_DEVMEM_BASE		0x02
#define CXLA_OP_STATS			0x03
#define CXLA_OP_RESET			0x04	/* a new driver: free all buffers, drop events */
#define CXLA_OP_COPY			0x10
#define CXLA_OP_FILL			0x11
#define CXLA_OP_CHECKSUM		0x12
#define CXLA_OP_ATOMIC			0x13
#define CXLA_OP_COPY_PAGES		0x14
#define CXLA_OP_FENCE			0x15
#define CXLA_OP_SIGNAL			0x16
#define CXLA_OP_ALLOC			0x20
#define CXLA_OP_FREE			0x21
#define CXLA_OP_EXPORT			0x22
#define CXLA_OP_UNEXPORT		0x23

/* Header flags */
#define CXLA_FLAG_FENCE			(1 << 0) /* start after all earlier commands completed */

/* Status codes (cxla_resp.status) */
#define CXLA_S_OK			0
#define CXLA_S_UNSUPPORTED		1	/* unknown opcode */
#define CXLA_S_INVALID			2	/* bad field value */
#define CXLA_S_TRUNCATED		3	/* request shorter than its contents */
#define CXLA_S_BAD_GPA			4	/* guest-physical range not in memory */
#define CXLA_S_BAD_DEVMEM		5	/* device-memory range out of bounds */
#define CXLA_S_OVERFLOW			6	/* address + length overflows */
#define CXLA_S_UNALIGNED		7
#define CXLA_S_TOO_LARGE		8	/* too many segments or request too big */
#define CXLA_S_LENGTH_MISMATCH		9	/* source and destination sizes differ */
#define CXLA_S_NO_SPACE			10	/* device memory exhausted */
#define CXLA_S_NOT_FOUND		11	/* unknown buffer id or object */
#define CXLA_S_BAD_CHAIN		12	/* malformed descriptor chain */
#define CXLA_S_NOT_READY		13	/* device memory not mapped by the guest */
#define CXLA_S_EXISTS			14
#define CXLA_S_INTERNAL			15
#define CXLA_S_INTERRUPTED		16	/* daemon restarted mid-command: outcome unknown */
#define CXLA_S_MEDIA_ERROR		17	/* poisoned device memory; detail = page (offset / 4096) */

/* Every request starts with this header, 16 bytes */
struct cxla_cmd_hdr {
	__le16 opcode;
	__le16 flags;
	__le32 reserved;
	__le64 tag;		/* echoed in the response */
};

/* Scatter-gather entry, 16 bytes */
struct cxla_sge {
	__le64 addr;
	__le32 len;
	__le16 space;
	__le16 reserved;
};

/* Every response starts with this, 32 bytes; payload may follow */
struct cxla_resp {
	__le32 status;
	__le32 detail;		/* index of the offending segment, or 0 */
	__le64 tag;
	__le64 result0;
	__le64 result1;
};

/* IDENTIFY response payload, 64 bytes */
struct cxla_identify {
	__le32 magic;
	__le16 version_major;
	__le16 version_minor;
	__le64 features;
	__le64 devmem_size;
	__le64 devmem_gpa;	/* 0 until known */
	__le64 devmem_free;
	__le32 num_dma_engines;
	__le32 max_segments;
	__le32 buffers;		/* live allocations */
	__le32 device_index;
	__le64 reserved;
};

/* SET_DEVMEM_BASE payload: guest-physical address of the memory BAR */
struct cxla_set_devmem_base {
	__le64 gpa;
};

/* COPY payload, followed by nr_src then nr_dst struct cxla_sge */
struct cxla_copy {
	__le32 nr_src;
	__le32 nr_dst;
};

/* FILL payload, followed by nr_dst struct cxla_sge; byte i of the
 * destination stream is byte (i % 8) of the little-endian pattern.
 */
struct cxla_fill {
	__le64 pattern;
	__le32 nr_dst;
	__le32 reserved;
};

/* CHECKSUM payload (crc32c over the concatenated ranges), followed by
 * nr_src struct cxla_sge. result0 = crc, result1 = bytes.
 */
struct cxla_checksum {
	__le32 nr_src;
	__le32 seed;
};

#define CXLA_ATOMIC_FETCH_ADD		0
#define CXLA_ATOMIC_CMPXCHG		1
#define CXLA_ATOMIC_SWAP		2

/* ATOMIC payload, 40 bytes. result0 = old value of the last operation,
 * result1 = operations performed (CMPXCHG: 1 if it succeeded, else 0).
 */
struct cxla_atomic {
	__le16 op;
	__le16 width;		/* 4 or 8 bytes, naturally aligned */
	__le16 space;
	__le16 reserved;
	__le64 addr;
	__le64 operand;
	__le64 compare;
	__le64 repeat;		/* FETCH_ADD only: separate atomic ops, >= 1 */
};

/* COPY_PAGES payload, followed by nr_pages __le64 source addresses and then
 * nr_pages __le64 destination addresses. result0 = pages copied.
 */
struct cxla_copy_pages {
	__le32 nr_pages;
	__le32 page_size;	/* power of two, 4 KiB .. 2 MiB */
	__le16 src_space;
	__le16 dst_space;
	__le32 reserved;
};

/* SIGNAL payload: the device posts CXLA_EVENT_SIGNAL carrying value */
struct cxla_signal {
	__le64 value;
};

/* ALLOC payload. result0 = buffer id, result1 = device-memory offset */
struct cxla_alloc {
	__le64 size;
	__le64 align;		/* power of two, 0 means 4 KiB */
};

/* FREE payload */
struct cxla_free {
	__le64 id;
};

/* EXPORT payload: attach a UUID to a buffer (host shared objects) */
struct cxla_export {
	__le64 id;
	__u8 uuid[16];
};

/* UNEXPORT payload */
struct cxla_unexport {
	__u8 uuid[16];
};

/* STATS response payload */
#define CXLA_STAT_COMMANDS		0
#define CXLA_STAT_ERRORS		1
#define CXLA_STAT_BYTES_COPIED		2
#define CXLA_STAT_BYTES_P2P		3
#define CXLA_STAT_BYTES_FILLED		4
#define CXLA_STAT_BYTES_CHECKSUMMED	5
#define CXLA_STAT_ATOMIC_OPS		6
#define CXLA_STAT_PAGES_COPIED		7
#define CXLA_STAT_EVENTS_SENT		8
#define CXLA_STAT_EVENTS_DROPPED	9
#define CXLA_STAT_MEDIA_ERRORS		10
#define CXLA_STAT_COUNT			16

struct cxla_stats {
	__le64 counter[CXLA_STAT_COUNT];
};

/* Event queue record, 32 bytes, written into driver-posted buffers */
#define CXLA_EVENT_SIGNAL		1	/* value0 = SIGNAL value */
#define CXLA_EVENT_ERROR		2	/* value0 = opcode, value1 = status */
#define CXLA_EVENT_DEVMEM_MAPPED	3	/* value0 = gpa of device memory */
#define CXLA_EVENT_POISON		4	/* value0 = offset, value1 = length */
#define CXLA_EVENT_POISON_CLEARED	5	/* value0 = offset, value1 = length */
/* an unmasked CXL RAS error: value0 = 0 correctable, 1 uncorrectable; value1 = its status bit */
#define CXLA_EVENT_CXL_RAS		6

struct cxla_event {
	__le32 kind;
	__le32 reserved;
	__le64 seq;
	__le64 value0;
	__le64 value1;
};

#endif /* CXL_ACCEL_PROTO_H */
