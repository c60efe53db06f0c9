// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Unit tests of the vfio-user wire format: the header, each command's decoding with its
//! length, flag and descriptor checks, and the replies' sizes.

use super::*;
use crate::vfio::RegionInfo;

fn header(command: u16, payload: &[u8], flags: u32) -> Header {
    Header {
        id: 7,
        command,
        size: (HEADER_SIZE + payload.len()) as u32,
        flags,
        error: 0,
    }
}

fn decode(command: u16, payload: &[u8], fds: usize) -> Result<Request<'_>, Errno> {
    Request::decode(&header(command, payload, 0), payload, fds)
}

fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn header_round_trips() {
    let h = Header {
        id: 0xbeef,
        command: 9,
        size: 0x1234_5678,
        flags: 0x21,
        error: 22,
    };
    assert_eq!(Header::parse(&h.encode()), h);
    assert_eq!(&h.encode()[..4], &[0xef, 0xbe, 9, 0]);
}

#[test]
fn version_needs_a_nul_terminated_json_object() {
    let mut p = vec![0, 0, 0, 0];
    p.extend_from_slice(b"{\"capabilities\":{}}\0");
    assert!(matches!(
        decode(command::VERSION, &p, 0),
        Ok(Request::Version { major: 0, minor: 0, json }) if json.starts_with('{')
    ));
    assert_eq!(
        decode(command::VERSION, &p[..p.len() - 1], 0),
        Err(Errno::EINVAL)
    );
    assert_eq!(decode(command::VERSION, &p[..3], 0), Err(Errno::EINVAL));
    assert_eq!(
        decode(command::VERSION, b"\0\0\0\0[]\0", 0),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        decode(command::VERSION, b"\0\0\0\0{}\0{}\0", 0),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        decode(command::VERSION, b"\0\0\0\0\xff\0", 0),
        Err(Errno::EINVAL)
    );
    assert!(matches!(
        decode(command::VERSION, b"\0\0\0\0", 0),
        Ok(Request::Version { json: "", .. })
    ));
}

#[test]
fn size_must_match_the_payload() {
    let p = words(&[16, 0, 0, 0]);
    let mut h = header(command::DEVICE_GET_INFO, &p, 0);
    h.size += 1;
    assert_eq!(Request::decode(&h, &p, 0), Err(Errno::EINVAL));
}

#[test]
fn dma_map_checks_argsz_flags_fds_and_wrap() {
    let map = |argsz: u32, flags: u32, iova: u64, size: u64| {
        let mut p = words(&[argsz, flags]);
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&iova.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        p
    };
    assert!(decode(command::DMA_MAP, &map(32, 3, 0x1000, 0x1000), 1).is_ok());
    assert!(decode(command::DMA_MAP, &map(32, 1, 0x1000, 0x1000), 0).is_ok());
    assert!(decode(command::DMA_MAP, &map(32, 1, 0, 1), 2).is_err());
    assert!(decode(command::DMA_MAP, &map(64, 1, 0, 1), 0).is_err());
    assert!(decode(command::DMA_MAP, &map(32, 4, 0, 1), 0).is_err());
    assert!(decode(command::DMA_MAP, &map(32, 1, u64::MAX, 2), 0).is_err());
    assert!(decode(command::DMA_MAP, &map(32, 1, 0, 0), 0).is_err());
    assert!(decode(command::DMA_MAP, &map(32, 1, 0, 1)[..31], 0).is_err());
}

#[test]
fn set_irqs_takes_one_fd_per_vector_or_none() {
    let set = |flags: u32, start: u32, count: u32| words(&[20, flags, 2, start, count]);
    let ev = IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER;
    assert!(decode(command::DEVICE_SET_IRQS, &set(ev, 0, 2), 2).is_ok());
    assert!(decode(command::DEVICE_SET_IRQS, &set(ev, 0, 2), 0).is_ok());
    assert!(decode(command::DEVICE_SET_IRQS, &set(ev, 0, 2), 1).is_err());
    let none = IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER;
    assert!(decode(command::DEVICE_SET_IRQS, &set(none, 0, 0), 0).is_ok());
    assert!(decode(command::DEVICE_SET_IRQS, &set(none, 0, 0), 1).is_err());
    assert!(decode(command::DEVICE_SET_IRQS, &set(ev | none, 0, 1), 1).is_err());
    assert!(decode(
        command::DEVICE_SET_IRQS,
        &set(IRQ_SET_DATA_EVENTFD, 0, 1),
        1
    )
    .is_err());
    assert!(decode(command::DEVICE_SET_IRQS, &set(ev, u32::MAX, 2), 0).is_err());
    let mut bools = words(&[22, IRQ_SET_DATA_BOOL | IRQ_SET_ACTION_MASK, 0, 0, 2]);
    bools.extend_from_slice(&[1, 0]);
    assert_eq!(
        decode(command::DEVICE_SET_IRQS, &bools, 0),
        Err(Errno::ENOTSUP)
    );
}

#[test]
fn region_access_counts_are_bounded() {
    let access = |offset: u64, count: u32| {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&words(&[7, count]));
        p
    };
    assert!(decode(command::REGION_READ, &access(0, 4096), 0).is_ok());
    let too_big = access(0, MAX_DATA_XFER + 1);
    assert_eq!(decode(command::REGION_READ, &too_big, 0), Err(Errno::E2BIG));
    assert!(decode(command::REGION_READ, &access(0, 0), 0).is_err());
    assert!(decode(command::REGION_READ, &access(u64::MAX, 2), 0).is_err());
    let mut w = access(0x10, 4);
    w.extend_from_slice(&[1, 2, 3, 4]);
    assert!(matches!(
        decode(command::REGION_WRITE, &w, 0),
        Ok(Request::RegionWrite {
            data: [1, 2, 3, 4],
            region: 7,
            offset: 0x10,
            ..
        })
    ));
    assert!(decode(command::REGION_WRITE, &w[..19], 0).is_err());
    w.push(5);
    assert!(decode(command::REGION_WRITE, &w, 0).is_err());
}

#[test]
fn replies_are_sized_as_qemu_expects() {
    let req = header(command::DEVICE_GET_REGION_INFO, &[0; 32], 0);
    let info = RegionInfo {
        flags: REGION_READ | REGION_CAPS,
        size: 4096,
        offset: 0,
    };
    let r = Reply::RegionInfo { index: 7, info }.encode(&req);
    assert_eq!(r.len(), 48);
    let h = Header::parse(r[..16].try_into().unwrap());
    assert_eq!((h.id, h.command, h.size, h.flags), (7, 5, 48, 1));
    assert_eq!(u32_at(&r, 20), REGION_READ, "CAPS is never announced");
    let e = Reply::Error(Errno::ENOSYS).encode(&req);
    let h = Header::parse(e[..16].try_into().unwrap());
    assert_eq!((h.size, h.flags, h.error), (16, 0x21, libc::ENOSYS as u32));
    assert_eq!(e.len(), 16);
}
