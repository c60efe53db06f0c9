// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Wire format between the daemon and the guest driver.
//!
//! The C side of this definition is `guest-driver/cxl_accel_proto.h`; the test
//! `tests/wire_format.rs` compiles a program against that header and checks every
//! constant, size and offset listed in [`LAYOUT`] and [`CONSTANTS`] against this file.
//! Semantics are in `docs/device-spec.md`.

use vm_memory::ByteValued;

// The structures below are used directly as little-endian wire records.
#[cfg(not(target_endian = "little"))]
compile_error!("cxl-accel encodes wire records in host order and needs a little-endian host");

pub const VIRTIO_ID: u32 = 21;
pub const MAGIC: u32 = 0x414c_5843;
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 1;

pub const QUEUE_CMD: usize = 0;
pub const QUEUE_EVENT: usize = 1;
/// The queues of a version 1.0 device: one command queue and the event queue.
pub const NUM_QUEUES: usize = 2;
/// Version 1.1: up to this many command queues (config `num_cmd_queues`); command queue
/// k is virtqueue 0 for k = 0, else virtqueue k + 1 (after the event queue).
pub const MAX_CMD_QUEUES: usize = 8;

/// The virtqueue index of command queue `k`.
pub const fn cmd_queue_index(k: usize) -> usize {
    if k == 0 {
        QUEUE_CMD
    } else {
        k + 1
    }
}

/// Which command queue virtqueue `q` is, if it is one.
pub const fn cmd_queue_of(q: usize) -> Option<usize> {
    match q {
        QUEUE_CMD => Some(0),
        QUEUE_EVENT => None,
        q => Some(q - 1),
    }
}

pub const F_ATOMIC_DEVMEM: u64 = 1 << 0;
pub const F_ATOMIC_GUEST: u64 = 1 << 1;
pub const F_P2P: u64 = 1 << 2;
pub const F_ALLOC: u64 = 1 << 3;
pub const F_COPY_PAGES: u64 = 1 << 4;
pub const F_EVENTS: u64 = 1 << 5;
pub const F_EXPORT: u64 = 1 << 6;
/// Device memory is attached as a CPU-less NUMA node (guest RAM), not as a BAR.
pub const F_NUMA: u64 = 1 << 7;
/// Device memory is VIRTIO shared memory region [`SHM_ID_DEVMEM`] of the virtio function
/// itself (a BAR of that function), not a BAR of an ivshmem sibling.
pub const F_SHMEM: u64 = 1 << 8;
/// The device is a CXL Type-2 endpoint: its PCI function has the CXL DVSECs and component
/// registers (with `F_SHMEM`: device memory is still the shared memory region's BAR).
pub const F_CXL: u64 = 1 << 9;
/// The shared memory region id (shmid) of device memory.
pub const SHM_ID_DEVMEM: u8 = 0;

pub const MAX_SEGMENTS: u32 = 4096;
pub const MAX_PAGES: u32 = 4096;
pub const MAX_REQUEST: u32 = 256 * 1024;
/// Writable descriptors per request (more: BAD_CHAIN); a response is 32 bytes and a small
/// payload.
pub const MAX_RESPONSE_SEGMENTS: u32 = 64;
/// Bytes one command may move, so that no command occupies an engine for long.
pub const MAX_TRANSFER: u64 = 1 << 30;
pub const MAX_ATOMIC_REPEAT: u64 = 1 << 27;

pub const SPACE_GPA: u16 = 0;
pub const SPACE_DEVMEM: u16 = 1;

pub const OP_NOP: u16 = 0x00;
pub const OP_IDENTIFY: u16 = 0x01;
pub const OP_SET_DEVMEM_BASE: u16 = 0x02;
pub const OP_STATS: u16 = 0x03;
pub const OP_RESET: u16 = 0x04;
pub const OP_COPY: u16 = 0x10;
pub const OP_FILL: u16 = 0x11;
pub const OP_CHECKSUM: u16 = 0x12;
pub const OP_ATOMIC: u16 = 0x13;
pub const OP_COPY_PAGES: u16 = 0x14;
pub const OP_FENCE: u16 = 0x15;
pub const OP_SIGNAL: u16 = 0x16;
pub const OP_ALLOC: u16 = 0x20;
pub const OP_FREE: u16 = 0x21;
pub const OP_EXPORT: u16 = 0x22;
pub const OP_UNEXPORT: u16 = 0x23;

pub const FLAG_FENCE: u16 = 1 << 0;

pub const ATOMIC_FETCH_ADD: u16 = 0;
pub const ATOMIC_CMPXCHG: u16 = 1;
pub const ATOMIC_SWAP: u16 = 2;

pub const STAT_COMMANDS: usize = 0;
pub const STAT_ERRORS: usize = 1;
pub const STAT_BYTES_COPIED: usize = 2;
pub const STAT_BYTES_P2P: usize = 3;
pub const STAT_BYTES_FILLED: usize = 4;
pub const STAT_BYTES_CHECKSUMMED: usize = 5;
pub const STAT_ATOMIC_OPS: usize = 6;
pub const STAT_PAGES_COPIED: usize = 7;
pub const STAT_EVENTS_SENT: usize = 8;
pub const STAT_EVENTS_DROPPED: usize = 9;
/// Commands that failed on poisoned device memory.
pub const STAT_MEDIA_ERRORS: usize = 10;
pub const STAT_COUNT: usize = 16;

pub const EVENT_SIGNAL: u32 = 1;
pub const EVENT_ERROR: u32 = 2;
pub const EVENT_DEVMEM_MAPPED: u32 = 3;
/// A range of device memory is poisoned: value0 = offset, value1 = length.
pub const EVENT_POISON: u32 = 4;
/// A poisoned range is usable again: value0 = offset, value1 = length.
pub const EVENT_POISON_CLEARED: u32 = 5;
/// An unmasked CXL RAS error (--attach cxl): value0 = 0 correctable, 1 uncorrectable;
/// value1 = the status bit raised. The RAS capability's registers say the rest.
pub const EVENT_CXL_RAS: u32 = 6;

/// Opcodes by name, as logs and the control channel spell them.
pub const OPCODES: [(u16, &str); 16] = [
    (OP_NOP, "NOP"),
    (OP_IDENTIFY, "IDENTIFY"),
    (OP_SET_DEVMEM_BASE, "SET_DEVMEM_BASE"),
    (OP_STATS, "STATS"),
    (OP_RESET, "RESET"),
    (OP_COPY, "COPY"),
    (OP_FILL, "FILL"),
    (OP_CHECKSUM, "CHECKSUM"),
    (OP_ATOMIC, "ATOMIC"),
    (OP_COPY_PAGES, "COPY_PAGES"),
    (OP_FENCE, "FENCE"),
    (OP_SIGNAL, "SIGNAL"),
    (OP_ALLOC, "ALLOC"),
    (OP_FREE, "FREE"),
    (OP_EXPORT, "EXPORT"),
    (OP_UNEXPORT, "UNEXPORT"),
];

pub fn opcode_name(op: u16) -> Option<&'static str> {
    OPCODES.iter().find(|(o, _)| *o == op).map(|(_, n)| *n)
}

pub fn opcode_by_name(name: &str) -> Option<u16> {
    OPCODES
        .iter()
        .find(|(_, n)| n.eq_ignore_ascii_case(name))
        .map(|(o, _)| *o)
}

/// Names of the device counters (STATS), as the driver's sysfs spells them.
pub fn stat_name(i: usize) -> &'static str {
    match i {
        STAT_COMMANDS => "commands",
        STAT_ERRORS => "errors",
        STAT_BYTES_COPIED => "bytes_copied",
        STAT_BYTES_P2P => "bytes_p2p",
        STAT_BYTES_FILLED => "bytes_filled",
        STAT_BYTES_CHECKSUMMED => "bytes_checksummed",
        STAT_ATOMIC_OPS => "atomic_ops",
        STAT_PAGES_COPIED => "pages_copied",
        STAT_EVENTS_SENT => "events_sent",
        STAT_EVENTS_DROPPED => "events_dropped",
        STAT_MEDIA_ERRORS => "media_errors",
        _ => "reserved",
    }
}

/// Status codes carried in [`Resp::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    Unsupported = 1,
    Invalid = 2,
    Truncated = 3,
    BadGpa = 4,
    BadDevmem = 5,
    Overflow = 6,
    Unaligned = 7,
    TooLarge = 8,
    LengthMismatch = 9,
    NoSpace = 10,
    NotFound = 11,
    BadChain = 12,
    NotReady = 13,
    Exists = 14,
    Internal = 15,
    Interrupted = 16,
    /// The command touched poisoned device memory (a media error).
    MediaError = 17,
}

impl Status {
    pub const ALL: [Status; 18] = [
        Status::Ok,
        Status::Unsupported,
        Status::Invalid,
        Status::Truncated,
        Status::BadGpa,
        Status::BadDevmem,
        Status::Overflow,
        Status::Unaligned,
        Status::TooLarge,
        Status::LengthMismatch,
        Status::NoSpace,
        Status::NotFound,
        Status::BadChain,
        Status::NotReady,
        Status::Exists,
        Status::Internal,
        Status::Interrupted,
        Status::MediaError,
    ];

    pub fn from_u32(v: u32) -> Option<Status> {
        Status::ALL.get(v as usize).copied()
    }

    /// Name used in logs and in the C header (`CXLA_S_<NAME>`).
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Unsupported => "UNSUPPORTED",
            Status::Invalid => "INVALID",
            Status::Truncated => "TRUNCATED",
            Status::BadGpa => "BAD_GPA",
            Status::BadDevmem => "BAD_DEVMEM",
            Status::Overflow => "OVERFLOW",
            Status::Unaligned => "UNALIGNED",
            Status::TooLarge => "TOO_LARGE",
            Status::LengthMismatch => "LENGTH_MISMATCH",
            Status::NoSpace => "NO_SPACE",
            Status::NotFound => "NOT_FOUND",
            Status::BadChain => "BAD_CHAIN",
            Status::NotReady => "NOT_READY",
            Status::Exists => "EXISTS",
            Status::Internal => "INTERNAL",
            Status::Interrupted => "INTERRUPTED",
            Status::MediaError => "MEDIA_ERROR",
        }
    }
}

/// Declares wire records: `#[repr(C)]`, plain integers, `ByteValued`.
macro_rules! wire_structs {
    ($( $(#[$m:meta])* $name:ident / $cname:literal { $( $field:ident : $ty:ty ),* $(,)? } )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
            pub struct $name { $( pub $field: $ty ),* }

            // SAFETY: repr(C) records of integers and byte arrays, sized without padding
            // (checked by `no_padding` below); every bit pattern is a valid value.
            unsafe impl ByteValued for $name {}
        )*

        /// (C struct name, field name or "" for sizeof, offset or size) for every record.
        pub fn layout() -> Vec<(&'static str, &'static str, usize)> {
            let mut v = Vec::new();
            $(
                v.push(($cname, "", std::mem::size_of::<$name>()));
                $( v.push(($cname, stringify!($field), std::mem::offset_of!($name, $field))); )*
            )*
            v
        }

        #[cfg(test)]
        mod no_padding {
            use super::*;
            #[test]
            fn records_have_no_padding() {
                $(
                    let fields: usize = 0 $( + std::mem::size_of::<$ty>() )*;
                    assert_eq!(fields, std::mem::size_of::<$name>(), stringify!($name));
                )*
            }
        }
    };
}

wire_structs! {
    /// Virtio config space.
    Config / "cxla_config" {
        magic: u32, version_major: u16, version_minor: u16, features: u64, devmem_size: u64,
        num_dma_engines: u32, max_segments: u32, read_latency_ns: u32, write_latency_ns: u32,
        read_bandwidth_mbs: u32, write_bandwidth_mbs: u32, device_index: u32, page_size: u32,
        max_request: u32, num_cmd_queues: u32,
    }
    CmdHdr / "cxla_cmd_hdr" { opcode: u16, flags: u16, reserved: u32, tag: u64 }
    Sge / "cxla_sge" { addr: u64, len: u32, space: u16, reserved: u16 }
    Resp / "cxla_resp" { status: u32, detail: u32, tag: u64, result0: u64, result1: u64 }
    Identify / "cxla_identify" {
        magic: u32, version_major: u16, version_minor: u16, features: u64, devmem_size: u64,
        devmem_gpa: u64, devmem_free: u64, num_dma_engines: u32, max_segments: u32,
        buffers: u32, device_index: u32, reserved: u64,
    }
    SetDevmemBase / "cxla_set_devmem_base" { gpa: u64 }
    Copy / "cxla_copy" { nr_src: u32, nr_dst: u32 }
    Fill / "cxla_fill" { pattern: u64, nr_dst: u32, reserved: u32 }
    Checksum / "cxla_checksum" { nr_src: u32, seed: u32 }
    Atomic / "cxla_atomic" {
        op: u16, width: u16, space: u16, reserved: u16, addr: u64, operand: u64, compare: u64,
        repeat: u64,
    }
    CopyPages / "cxla_copy_pages" {
        nr_pages: u32, page_size: u32, src_space: u16, dst_space: u16, reserved: u32,
    }
    Signal / "cxla_signal" { value: u64 }
    Alloc / "cxla_alloc" { size: u64, align: u64 }
    Free / "cxla_free" { id: u64 }
    Export / "cxla_export" { id: u64, uuid: [u8; 16] }
    Unexport / "cxla_unexport" { uuid: [u8; 16] }
    Stats / "cxla_stats" { counter: [u64; STAT_COUNT] }
    Event / "cxla_event" { kind: u32, reserved: u32, seq: u64, value0: u64, value1: u64 }
}

/// Every `#define` of the C header with its value, for the cross-language check.
pub fn constants() -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = vec![
        ("CXLA_VIRTIO_ID".into(), VIRTIO_ID as u64),
        ("CXLA_MAGIC".into(), MAGIC as u64),
        ("CXLA_VERSION_MAJOR".into(), VERSION_MAJOR as u64),
        ("CXLA_VERSION_MINOR".into(), VERSION_MINOR as u64),
        ("CXLA_QUEUE_CMD".into(), QUEUE_CMD as u64),
        ("CXLA_QUEUE_EVENT".into(), QUEUE_EVENT as u64),
        ("CXLA_NUM_QUEUES".into(), NUM_QUEUES as u64),
        ("CXLA_MAX_CMD_QUEUES".into(), MAX_CMD_QUEUES as u64),
        ("CXLA_F_ATOMIC_DEVMEM".into(), F_ATOMIC_DEVMEM),
        ("CXLA_F_ATOMIC_GUEST".into(), F_ATOMIC_GUEST),
        ("CXLA_F_P2P".into(), F_P2P),
        ("CXLA_F_ALLOC".into(), F_ALLOC),
        ("CXLA_F_COPY_PAGES".into(), F_COPY_PAGES),
        ("CXLA_F_EVENTS".into(), F_EVENTS),
        ("CXLA_F_EXPORT".into(), F_EXPORT),
        ("CXLA_F_NUMA".into(), F_NUMA),
        ("CXLA_F_SHMEM".into(), F_SHMEM),
        ("CXLA_F_CXL".into(), F_CXL),
        ("CXLA_SHM_ID_DEVMEM".into(), SHM_ID_DEVMEM as u64),
        ("CXLA_MAX_SEGMENTS".into(), MAX_SEGMENTS as u64),
        ("CXLA_MAX_PAGES".into(), MAX_PAGES as u64),
        ("CXLA_MAX_REQUEST".into(), MAX_REQUEST as u64),
        (
            "CXLA_MAX_RESPONSE_SEGMENTS".into(),
            MAX_RESPONSE_SEGMENTS as u64,
        ),
        ("CXLA_MAX_TRANSFER".into(), MAX_TRANSFER),
        ("CXLA_MAX_ATOMIC_REPEAT".into(), MAX_ATOMIC_REPEAT),
        ("CXLA_SPACE_GPA".into(), SPACE_GPA as u64),
        ("CXLA_SPACE_DEVMEM".into(), SPACE_DEVMEM as u64),
        ("CXLA_OP_NOP".into(), OP_NOP as u64),
        ("CXLA_OP_IDENTIFY".into(), OP_IDENTIFY as u64),
        ("CXLA_OP_SET_DEVMEM_BASE".into(), OP_SET_DEVMEM_BASE as u64),
        ("CXLA_OP_STATS".into(), OP_STATS as u64),
        ("CXLA_OP_RESET".into(), OP_RESET as u64),
        ("CXLA_OP_COPY".into(), OP_COPY as u64),
        ("CXLA_OP_FILL".into(), OP_FILL as u64),
        ("CXLA_OP_CHECKSUM".into(), OP_CHECKSUM as u64),
        ("CXLA_OP_ATOMIC".into(), OP_ATOMIC as u64),
        ("CXLA_OP_COPY_PAGES".into(), OP_COPY_PAGES as u64),
        ("CXLA_OP_FENCE".into(), OP_FENCE as u64),
        ("CXLA_OP_SIGNAL".into(), OP_SIGNAL as u64),
        ("CXLA_OP_ALLOC".into(), OP_ALLOC as u64),
        ("CXLA_OP_FREE".into(), OP_FREE as u64),
        ("CXLA_OP_EXPORT".into(), OP_EXPORT as u64),
        ("CXLA_OP_UNEXPORT".into(), OP_UNEXPORT as u64),
        ("CXLA_FLAG_FENCE".into(), FLAG_FENCE as u64),
        ("CXLA_ATOMIC_FETCH_ADD".into(), ATOMIC_FETCH_ADD as u64),
        ("CXLA_ATOMIC_CMPXCHG".into(), ATOMIC_CMPXCHG as u64),
        ("CXLA_ATOMIC_SWAP".into(), ATOMIC_SWAP as u64),
        ("CXLA_STAT_COMMANDS".into(), STAT_COMMANDS as u64),
        ("CXLA_STAT_ERRORS".into(), STAT_ERRORS as u64),
        ("CXLA_STAT_BYTES_COPIED".into(), STAT_BYTES_COPIED as u64),
        ("CXLA_STAT_BYTES_P2P".into(), STAT_BYTES_P2P as u64),
        ("CXLA_STAT_BYTES_FILLED".into(), STAT_BYTES_FILLED as u64),
        (
            "CXLA_STAT_BYTES_CHECKSUMMED".into(),
            STAT_BYTES_CHECKSUMMED as u64,
        ),
        ("CXLA_STAT_ATOMIC_OPS".into(), STAT_ATOMIC_OPS as u64),
        ("CXLA_STAT_PAGES_COPIED".into(), STAT_PAGES_COPIED as u64),
        ("CXLA_STAT_EVENTS_SENT".into(), STAT_EVENTS_SENT as u64),
        (
            "CXLA_STAT_EVENTS_DROPPED".into(),
            STAT_EVENTS_DROPPED as u64,
        ),
        ("CXLA_STAT_COUNT".into(), STAT_COUNT as u64),
        ("CXLA_EVENT_SIGNAL".into(), EVENT_SIGNAL as u64),
        ("CXLA_EVENT_ERROR".into(), EVENT_ERROR as u64),
        (
            "CXLA_EVENT_DEVMEM_MAPPED".into(),
            EVENT_DEVMEM_MAPPED as u64,
        ),
        ("CXLA_EVENT_POISON".into(), EVENT_POISON as u64),
        (
            "CXLA_EVENT_POISON_CLEARED".into(),
            EVENT_POISON_CLEARED as u64,
        ),
        ("CXLA_EVENT_CXL_RAS".into(), EVENT_CXL_RAS as u64),
        ("CXLA_STAT_MEDIA_ERRORS".into(), STAT_MEDIA_ERRORS as u64),
    ];
    for s in Status::ALL {
        v.push((format!("CXLA_S_{}", s.name()), s as u64));
    }
    v
}
