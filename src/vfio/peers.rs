// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Peers' device memory over vfio-user. QEMU maps another device's BAR into our DMA space
//! without the file behind it (QEMU holds no descriptor for memory a device gave it), so
//! the daemon opens the peers' memory files itself (`--peer-memory-path`, before the
//! sandbox) and tells which peer a mapping is by the guest address that peer's daemon
//! publishes in its state file (`device::state::guest_address_of`). A peer whose state
//! file cannot be read (a `--state-path` elsewhere, another owner) is recognised by its
//! size, when no other such peer has that size.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vm_memory::{FileOffset, GuestAddress, GuestRegionMmap, MmapRegion};

use crate::device::devmem::FileId;
use crate::device::state;

/// A peer device's memory file and what tells where the guest sees it.
struct Peer {
    path: PathBuf,
    file: File,
    id: FileId,
    size: u64,
    /// The peer daemon's state file, read for the address it publishes.
    state: Option<File>,
}

/// The peers of one daemon, opened once.
#[derive(Default)]
pub struct Peers(Vec<Peer>);

/// What a mapping QEMU gave without a file turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Peer `index`'s memory.
    Peer(usize),
    /// More than one peer could be it, and none says it is.
    Ambiguous,
    /// No peer's.
    None,
}

impl Peers {
    /// Opens the memory file of each peer and, when it can, the peer's state file at
    /// `state_path(memory file)`. A peer that cannot be opened is left out, with a
    /// warning: copies to its memory then fail as to any address we cannot reach.
    pub fn open(paths: &[PathBuf], state_path: impl Fn(&Path) -> PathBuf) -> Peers {
        let mut peers = Vec::new();
        for path in paths {
            match Self::open_one(path, &state_path) {
                Ok(p) => {
                    if p.state.is_none() {
                        log::info!(
                            "peer {}: no state file at {}; recognised by its size alone",
                            path.display(),
                            state_path(path).display()
                        );
                    }
                    peers.push(p)
                }
                Err(e) => log::warn!(
                    "peer {}: cannot open it ({e}); copies to its memory will fail",
                    path.display()
                ),
            }
        }
        Peers(peers)
    }

    fn open_one(path: &Path, state_path: &impl Fn(&Path) -> PathBuf) -> std::io::Result<Peer> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() == 0 {
            return Err(std::io::Error::other("not a non-empty regular file"));
        }
        Ok(Peer {
            path: path.to_path_buf(),
            id: FileId::from_metadata(&meta),
            size: meta.len(),
            state: File::open(state_path(path)).ok(),
            file,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whose memory `[iova, iova + size)` is, leaving out the peers in `taken` (mapped
    /// already, at another address).
    pub fn find(&self, iova: u64, size: u64, taken: &[usize]) -> Found {
        let free = || (0..self.0.len()).filter(|i| !taken.contains(i));
        let mut by_size = Vec::new();
        for i in free() {
            let p = &self.0[i];
            match p.state.as_ref().map(|s| state::guest_address_of(s, p.id)) {
                Some(Some(at)) if at == iova && size <= p.size => return Found::Peer(i),
                // Its daemon says it is elsewhere, or not mapped.
                Some(_) => {}
                None if p.size == size => by_size.push(i),
                None => {}
            }
        }
        match by_size[..] {
            [i] => Found::Peer(i),
            [] => Found::None,
            _ => Found::Ambiguous,
        }
    }

    /// Maps the first `size` bytes of peer `index`'s memory at `iova`.
    pub fn map(&self, index: usize, iova: u64, size: u64) -> std::io::Result<Arc<GuestRegionMmap>> {
        let p = &self.0[index];
        let len = usize::try_from(size).map_err(std::io::Error::other)?;
        let file = p.file.try_clone()?;
        let mmap = MmapRegion::build(
            Some(FileOffset::new(file, 0)),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .map_err(std::io::Error::other)?;
        let region = GuestRegionMmap::new(mmap, GuestAddress(iova))
            .ok_or_else(|| std::io::Error::other("the range wraps"))?;
        log::info!(
            "peer {} mapped at {iova:#x} ({size} bytes)",
            p.path.display()
        );
        Ok(Arc::new(region))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::state::StateFile;

    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("cxl-peers-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        /// A peer's memory file of `size` bytes, with a state file when `gpa` is given.
        fn peer(
            &self,
            name: &str,
            size: u64,
            gpa: Option<Option<u64>>,
        ) -> (PathBuf, Option<StateFile>) {
            let path = self.0.join(name);
            let f = File::create(&path).unwrap();
            f.set_len(size).unwrap();
            let state = gpa.map(|gpa| {
                let id = FileId::of(&f).unwrap();
                let (s, _) = StateFile::open(&state_of(&path), id, size, false).unwrap();
                s.set_guest_address(gpa);
                s
            });
            (path, state)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn state_of(p: &Path) -> PathBuf {
        let mut s = p.as_os_str().to_owned();
        s.push(".state");
        PathBuf::from(s)
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn peers_of_one_size_are_told_apart_by_the_address_their_daemons_publish() {
        let d = Scratch::new("published");
        let (a, _sa) = d.peer("a", 4 * MIB, Some(Some(0x1_0000_0000)));
        let (b, sb) = d.peer("b", 4 * MIB, Some(Some(0x1_4000_0000)));
        let peers = Peers::open(&[a, b], state_of);
        assert_eq!(peers.find(0x1_4000_0000, 4 * MIB, &[]), Found::Peer(1));
        assert_eq!(peers.find(0x1_0000_0000, 4 * MIB, &[]), Found::Peer(0));
        // Neither is there: a device of the same size that is no peer.
        assert_eq!(peers.find(0x2_0000_0000, 4 * MIB, &[]), Found::None);
        // The guest moved b: the published address follows.
        sb.as_ref().unwrap().set_guest_address(Some(0x2_0000_0000));
        assert_eq!(peers.find(0x2_0000_0000, 4 * MIB, &[]), Found::Peer(1));
        assert_eq!(peers.find(0x2_0000_0000, 4 * MIB, &[1]), Found::None);
    }

    #[test]
    fn without_state_files_only_a_size_no_other_peer_has_identifies_a_peer() {
        let d = Scratch::new("sizes");
        let (a, _) = d.peer("a", 4 * MIB, None);
        let (b, _) = d.peer("b", 4 * MIB, None);
        let (c, _) = d.peer("c", 8 * MIB, None);
        let peers = Peers::open(&[a, b, c], state_of);
        assert_eq!(peers.find(0x1000_0000, 8 * MIB, &[]), Found::Peer(2));
        assert_eq!(peers.find(0x1000_0000, 4 * MIB, &[]), Found::Ambiguous);
        // Once one of the two is mapped elsewhere, the other is the only candidate.
        assert_eq!(peers.find(0x1000_0000, 4 * MIB, &[0]), Found::Peer(1));
        assert_eq!(peers.find(0x1000_0000, 2 * MIB, &[]), Found::None);
    }

    #[test]
    fn a_mapped_peer_shares_its_memory_and_a_missing_one_is_left_out() {
        let d = Scratch::new("map");
        let (a, _s) = d.peer("a", 2 * MIB, Some(Some(0x4000_0000)));
        let missing = d.0.join("missing");
        let peers = Peers::open(&[missing, a.clone()], state_of);
        let Found::Peer(i) = peers.find(0x4000_0000, 2 * MIB, &[]) else {
            panic!("peer not found");
        };
        let region = peers.map(i, 0x4000_0000, 2 * MIB).unwrap();
        use vm_memory::{Bytes, MemoryRegionAddress};
        region
            .write_slice(b"p2p", MemoryRegionAddress(4096))
            .unwrap();
        let mut back = [0u8; 3];
        use std::os::unix::fs::FileExt;
        File::open(&a)
            .unwrap()
            .read_exact_at(&mut back, 4096)
            .unwrap();
        assert_eq!(&back, b"p2p");
    }
}
