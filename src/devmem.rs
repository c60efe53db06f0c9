//! Device memory: a file shared with QEMU, mapped here and exposed to the guest as a BAR.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use vm_memory::{FileOffset, MmapRegion, VolatileMemory, VolatileSlice};

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

#[derive(Debug)]
pub enum DevmemError {
    Open(PathBuf, io::Error),
    WrongSize {
        path: PathBuf,
        actual: u64,
        wanted: u64,
    },
    Resize(PathBuf, io::Error),
    Map(PathBuf, String),
    BadSize(u64),
}

impl std::fmt::Display for DevmemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DevmemError::Open(p, e) => write!(f, "cannot open memory file {}: {e}", p.display()),
            DevmemError::WrongSize {
                path,
                actual,
                wanted,
            } => write!(
                f,
                "memory file {} is {actual} bytes but --memory-size asks for {wanted}; \
                 pass --memory-size {actual} or remove the file",
                path.display()
            ),
            DevmemError::Resize(p, e) => {
                write!(f, "cannot size memory file {}: {e}", p.display())
            }
            DevmemError::Map(p, e) => write!(f, "cannot map memory file {}: {e}", p.display()),
            DevmemError::BadSize(s) => write!(
                f,
                "memory size {s} must be a non-zero multiple of 2 MiB (the guest maps it in 2 MiB sections)"
            ),
        }
    }
}

impl std::error::Error for DevmemError {}

/// The device's own memory, mapped shared.
pub struct DeviceMemory {
    region: MmapRegion,
    id: FileId,
}

pub const DEVMEM_ALIGN: u64 = 2 << 20;

impl DeviceMemory {
    /// Opens `path`, creating and sizing it when missing or empty. An existing file of another
    /// size is an error: it may hold data of a device with a different configuration.
    pub fn open(path: &Path, size: u64) -> Result<DeviceMemory, DevmemError> {
        if size == 0 || !size.is_multiple_of(DEVMEM_ALIGN) {
            return Err(DevmemError::BadSize(size));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| DevmemError::Open(path.to_owned(), e))?;
        let actual = file
            .metadata()
            .map_err(|e| DevmemError::Open(path.to_owned(), e))?
            .len();
        if actual == 0 {
            file.set_len(size)
                .map_err(|e| DevmemError::Resize(path.to_owned(), e))?;
        } else if actual != size {
            return Err(DevmemError::WrongSize {
                path: path.to_owned(),
                actual,
                wanted: size,
            });
        }
        Self::from_file(file, size).map_err(|e| DevmemError::Map(path.to_owned(), e))
    }

    /// Maps an already sized file (for example a memfd in tests).
    pub fn from_file(file: File, size: u64) -> Result<DeviceMemory, String> {
        let id = FileId::of(&file).map_err(|e| e.to_string())?;
        let len = usize::try_from(size).map_err(|e| e.to_string())?;
        let region =
            MmapRegion::from_file(FileOffset::new(file, 0), len).map_err(|e| e.to_string())?;
        Ok(DeviceMemory { region, id })
    }

    pub fn size(&self) -> u64 {
        self.region.size() as u64
    }

    pub fn id(&self) -> FileId {
        self.id
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
