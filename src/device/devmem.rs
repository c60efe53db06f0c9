// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Device memory: a file shared with QEMU, mapped here and exposed to the guest as a BAR.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use vm_memory::{FileOffset, MmapRegion, VolatileMemory, VolatileSlice};

use crate::host::files::{self, FileError};
use crate::host::sigbus;
use std::os::fd::AsRawFd;

/// How a daemon holds its memory file.
#[derive(Clone, Copy, Debug, Default)]
pub struct Access {
    /// Take the lock that says "a daemon owns this device" (a supervisor takes it for its
    /// workers, which pass false).
    pub lock: bool,
    /// The group that may open the file too (`--socket-group`): QEMU opens it by path.
    pub group: files::Group,
}

/// Identity of a file, used to recognise it in the vhost-user memory table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub fn from_metadata(m: &std::fs::Metadata) -> FileId {
        FileId {
            dev: m.dev(),
            ino: m.ino(),
        }
    }

    pub fn of(file: &File) -> io::Result<FileId> {
        Ok(Self::from_metadata(&file.metadata()?))
    }

    pub fn of_path(path: &Path) -> io::Result<FileId> {
        Ok(Self::from_metadata(&std::fs::metadata(path)?))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DevmemError {
    #[error("cannot open memory file {}: {source}", .path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error(
        "memory file {} is {actual} bytes but --memory-size asks for {wanted}; \
         pass --memory-size {actual} or remove the file",
        .path.display()
    )]
    WrongSize {
        path: PathBuf,
        actual: u64,
        wanted: u64,
    },
    #[error("cannot size memory file {}: {source}", .path.display())]
    Resize { path: PathBuf, source: io::Error },
    #[error("cannot map memory file {}: {source}", .path.display())]
    Map { path: PathBuf, source: MapError },
    #[error(
        "memory size {0} must be a non-zero multiple of 2 MiB (the guest maps it in 2 MiB sections)"
    )]
    BadSize(u64),
    /// Not ours to use (a link, another user's file, locked, no space).
    #[error(transparent)]
    Refused(#[from] FileError),
}

/// Why a sized file cannot be mapped as device memory.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("{0}")]
    Stat(io::Error),
    #[error("{0} bytes do not fit this host's address space")]
    TooLarge(u64),
    #[error("{0}")]
    Mmap(vm_memory::mmap::MmapRegionError),
    #[error(transparent)]
    Sigbus(#[from] sigbus::TableFull),
}

/// The device's own memory, mapped shared.
pub struct DeviceMemory {
    /// A truncated file (QEMU holds it read-write) must not kill us: see sigbus.rs.
    /// Unregistered before the mapping goes.
    _sigbus: sigbus::Guard,
    region: MmapRegion,
    id: FileId,
}

pub const DEVMEM_ALIGN: u64 = 2 << 20;

impl DeviceMemory {
    /// Opens `path`, creating and sizing it when missing or empty. An existing file of another
    /// size is an error: it may hold data of a device with a different configuration.
    /// The file is private to the daemon's user (see [`files::open_private`]), allocated in
    /// full, and not locked (see [`DeviceMemory::open_with`]).
    pub fn open(path: &Path, size: u64) -> Result<DeviceMemory, DevmemError> {
        Self::open_with(path, size, Access::default())
    }

    /// [`DeviceMemory::open`], with the lock that makes the device this daemon's own and
    /// the group that may open the file besides the daemon's user.
    pub fn open_with(path: &Path, size: u64, access: Access) -> Result<DeviceMemory, DevmemError> {
        if size == 0 || !size.is_multiple_of(DEVMEM_ALIGN) {
            return Err(DevmemError::BadSize(size));
        }
        let file = files::open_private(path, "memory file", access.group)?;
        if access.lock {
            files::lock_exclusive(&file, path, "memory file")?;
        }
        let actual = file
            .metadata()
            .map_err(|source| DevmemError::Open {
                path: path.to_owned(),
                source,
            })?
            .len();
        if actual == 0 {
            file.set_len(size).map_err(|source| DevmemError::Resize {
                path: path.to_owned(),
                source,
            })?;
        } else if actual != size {
            return Err(DevmemError::WrongSize {
                path: path.to_owned(),
                actual,
                wanted: size,
            });
        }
        files::allocate(&file, size, path, "memory file")?;
        Self::from_file(file, size).map_err(|source| DevmemError::Map {
            path: path.to_owned(),
            source,
        })
    }

    /// Maps an already sized file (for example a memfd in tests).
    pub fn from_file(file: File, size: u64) -> Result<DeviceMemory, MapError> {
        let id = FileId::of(&file).map_err(MapError::Stat)?;
        let len = usize::try_from(size).map_err(|_| MapError::TooLarge(size))?;
        let fd = file.as_raw_fd();
        let region =
            MmapRegion::from_file(FileOffset::new(file, 0), len).map_err(MapError::Mmap)?;
        let guard = sigbus::register(region.as_ptr(), len, fd)?;
        Ok(DeviceMemory {
            _sigbus: guard,
            region,
            id,
        })
    }

    pub fn size(&self) -> u64 {
        self.region.size() as u64
    }

    pub fn id(&self) -> FileId {
        self.id
    }

    /// A new descriptor of the memory file, to hand to the front-end.
    pub fn file(&self) -> io::Result<File> {
        match self.region.file_offset() {
            Some(fo) => fo.file().try_clone(),
            None => Err(io::Error::other("device memory has no file")),
        }
    }

    /// Zeroes all of device memory (a CXL Reset with Mem Clr). QEMU maps the same file, so
    /// the guest sees zeros through the BAR and the region at once.
    pub fn clear(&self) {
        let zeros = vec![0u8; DEVMEM_ALIGN as usize];
        let mut at = 0;
        while let Some(s) = self.slice(at, DEVMEM_ALIGN) {
            s.copy_from(&zeros);
            at += DEVMEM_ALIGN;
        }
    }

    /// Slice of device memory; `None` when the range is out of bounds.
    pub fn slice(&self, offset: u64, len: u64) -> Option<VolatileSlice<'_>> {
        let end = offset.checked_add(len)?;
        if end > self.size() {
            return None;
        }
        self.region.get_slice(offset as usize, len as usize).ok()
    }
}
