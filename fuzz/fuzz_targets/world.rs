// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What the fuzz targets share: a device over anonymous shared memory, and its guest.

use std::fs::File;
use std::os::fd::FromRawFd;

use cxl_accel::device::{Device, DeviceConfig};
use cxl_accel::device::devmem::DeviceMemory;
use vm_memory::GuestMemoryMmap;

pub fn memfd(size: u64) -> File {
    // SAFETY: memfd_create with a static C string; the fd is owned by the File.
    let fd = unsafe { libc::memfd_create(c"cxl-accel-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd was just created and is not owned elsewhere.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f
}

/// A device with default settings and `devmem` bytes of memory, and the guest memory
/// it works on.
pub struct World {
    pub device: Device,
    pub mem: GuestMemoryMmap,
}

impl World {
    pub fn new(devmem: u64, mem: GuestMemoryMmap) -> World {
        let dm = DeviceMemory::from_file(memfd(devmem), devmem).unwrap();
        World {
            device: Device::new(DeviceConfig::default(), dm),
            mem,
        }
    }
}
