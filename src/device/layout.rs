// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Where the guest sees device memory: our own (learned from a memory table's files or
//! told by a transport that places the BAR itself) and peers', and what a move of ours
//! tells the log, the driver and the state file.

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::Device;
use crate::device::devmem::FileId;
use crate::protocol::EVENT_DEVMEM_MAPPED;

/// What the device learned from the memory table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Guest-physical base of our own device memory, once the guest maps the BAR.
    pub devmem_gpa: Option<u64>,
    /// Guest-physical ranges (start, length) backed by peers' device memory.
    pub peers: Vec<(u64, u64)>,
}

/// Why a memory table is refused.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("cannot stat the file of the region at {start:#x}: {source}")]
    Stat { start: u64, source: std::io::Error },
    #[error(
        "region at {start:#x} ({len} bytes at file offset {offset:#x}) runs past the end of its \
         {file_len}-byte file"
    )]
    PastEnd {
        start: u64,
        len: u64,
        offset: u64,
        file_len: u64,
    },
    #[error("device layout lock poisoned")]
    Poisoned,
}

fn log_new_peers(known: &[(u64, u64)], found: &[(u64, u64)]) {
    for p in found.iter().filter(|p| !known.contains(p)) {
        log::info!("peer device memory at {:#x} ({} bytes)", p.0, p.1);
    }
}

impl Device {
    /// Where the guest mapped device memory, when the transport knows it first hand (the
    /// BAR address of a PCI function the daemon serves itself) rather than from a memory
    /// table.
    pub fn set_devmem_gpa(&self, gpa: Option<u64>) {
        let Ok(mut layout) = self.layout.write() else {
            return;
        };
        let moved = layout.devmem_gpa != gpa;
        layout.devmem_gpa = gpa;
        drop(layout);
        if moved {
            self.devmem_moved(gpa);
        }
    }

    /// Where the guest mapped device memory, as the daemon this one takes over from knew
    /// it: the driver was told then, and peers' daemons read it still.
    pub fn take_over_devmem_gpa(&self, gpa: Option<u64>) {
        if let Ok(mut layout) = self.layout.write() {
            layout.devmem_gpa = gpa;
        }
        self.state.set_guest_address(gpa);
    }

    /// Tells the log, the driver (an event) and peers' daemons (the state file) where
    /// the guest now sees device memory; the layout has it already.
    fn devmem_moved(&self, gpa: Option<u64>) {
        self.state.set_guest_address(gpa);
        match gpa {
            Some(gpa) => {
                log::info!("device memory mapped by the guest at {gpa:#x}");
                self.post_event(EVENT_DEVMEM_MAPPED, gpa, self.devmem.size());
            }
            None => log::info!("device memory no longer mapped by the guest"),
        }
    }

    pub fn layout(&self) -> Layout {
        self.layout.read().map(|l| l.clone()).unwrap_or_default()
    }

    /// Learns where our own and our peers' device memory sit in guest-physical space, by
    /// the identity of the files behind the memory table's regions (sizes can coincide).
    /// A region that runs past the end of its file is refused, table and all: touching it
    /// would raise SIGBUS. A refused table leaves the layout as it was.
    pub fn update_memory(&self, guest: &GuestMemoryMmap) -> Result<(), TableError> {
        let found = self.scan(guest)?;
        let Ok(mut cur) = self.layout.write() else {
            return Err(TableError::Poisoned);
        };
        let moved = found.devmem_gpa != cur.devmem_gpa;
        log_new_peers(&cur.peers, &found.peers);
        *cur = found;
        let gpa = cur.devmem_gpa;
        drop(cur);
        if moved {
            self.devmem_moved(gpa);
        }
        Ok(())
    }

    /// Learns where peers' device memory sits, as `update_memory` does, for a transport
    /// that learns where our own memory sits otherwise (vfio-user: from our BAR).
    pub fn update_peers(&self, guest: &GuestMemoryMmap) -> Result<(), TableError> {
        let found = self.scan(guest)?;
        let Ok(mut cur) = self.layout.write() else {
            return Err(TableError::Poisoned);
        };
        log_new_peers(&cur.peers, &found.peers);
        cur.peers = found.peers;
        Ok(())
    }

    /// Our memory and peers' in a memory table, recognised by the files behind it.
    fn scan(&self, guest: &GuestMemoryMmap) -> Result<Layout, TableError> {
        let mut layout = Layout::default();
        let peer_ids: Vec<FileId> = self
            .cfg
            .peers
            .iter()
            .filter_map(|p| FileId::of_path(p).ok())
            .collect();
        for region in guest.iter() {
            let Some(fo) = region.file_offset() else {
                continue;
            };
            let start = region.start_addr().0;
            let meta = fo
                .file()
                .metadata()
                .map_err(|source| TableError::Stat { start, source })?;
            if fo
                .start()
                .checked_add(region.len())
                .is_none_or(|end| end > meta.len())
            {
                return Err(TableError::PastEnd {
                    start,
                    len: region.len(),
                    offset: fo.start(),
                    file_len: meta.len(),
                });
            }
            let id = FileId::from_metadata(&meta);
            if id == self.devmem.id() {
                match start.checked_sub(fo.start()) {
                    Some(base) => layout.devmem_gpa = Some(base),
                    None => log::warn!("device memory region at {start:#x} has an odd file offset"),
                }
            } else if peer_ids.contains(&id) {
                layout.peers.push((start, region.len()));
            }
        }
        Ok(layout)
    }
}
