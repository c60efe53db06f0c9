// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Anonymous shared memory for the fuzz targets' guest and device memories.

use std::fs::File;
use std::os::fd::FromRawFd;

pub fn memfd(size: u64) -> File {
    // SAFETY: memfd_create with a static C string; the fd is owned by the File.
    let fd = unsafe { libc::memfd_create(c"cxl-accel-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd was just created and is not owned elsewhere.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f
}
