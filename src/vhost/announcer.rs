// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The backend-channel thread: shared-object announcements (exported buffers' UUIDs) and
//! shared-memory attach's map and unmap requests, sent to the front-end over the
//! vhost-user backend channel.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags, VhostUserSharedMsg};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};
use vm_memory::ByteValued;

use crate::device::{ExportSink, RateLimitedLog};
use crate::protocol::SHM_ID_DEVMEM;

/// Publishes exported buffers' UUIDs to the front-end as vhost-user shared objects.
///
/// One thread per device (for the daemon's life: [`crate::vhost::server::serve_endpoint`] makes
/// it) talks to whichever backend channel is current, so a front-end that sends
/// SET_BACKEND_REQ_FD again and again costs no thread. Announcements
/// ask for no reply: a front-end that never answers cannot hold the thread (only one that
/// stops reading its channel altogether can, until it closes it, and meanwhile at most
/// `QUEUED` announcements wait; more are dropped and counted).
///
/// It also carries shared-memory attach's requests: map device memory (once the device is
/// started) and unmap it when the daemon exits.
pub struct Announcer {
    tx: Mutex<std::sync::mpsc::SyncSender<Announce>>,
    log: RateLimitedLog,
    /// Bytes of device memory the front-end maps for a started device (0: none), which
    /// the daemon unmaps when it exits.
    mapped: AtomicU64,
}

enum Announce {
    /// A new backend channel (None: the session ended).
    Channel(Option<Backend>),
    Update {
        add: bool,
        uuid: [u8; 16],
    },
    /// Map `len` bytes of this file as device memory (shared memory region 0).
    Map {
        file: std::fs::File,
        len: u64,
    },
    /// Unmap device memory, then say so.
    Unmap {
        len: u64,
        done: std::sync::mpsc::SyncSender<()>,
    },
}

/// Every device's announcer, for the unmapping at exit.
static ANNOUNCERS: Mutex<Vec<std::sync::Weak<Announcer>>> = Mutex::new(Vec::new());

/// How long the exit waits for each device's unmap request to be sent.
const UNMAP_AT_EXIT: Duration = Duration::from_millis(500);

/// The daemon is exiting: ask the front-end to unmap every device memory it maps for a
/// started device, so that the guest no longer sees memory of a device that is gone.
pub fn unmap_before_exit() {
    let live: Vec<Arc<Announcer>> = match ANNOUNCERS.lock() {
        Ok(a) => a.iter().filter_map(|w| w.upgrade()).collect(),
        Err(_) => return,
    };
    for a in live {
        let len = a.mapped.swap(0, Ordering::AcqRel);
        if len == 0 {
            continue;
        }
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        a.send(Announce::Unmap { len, done });
        let _ = wait.recv_timeout(UNMAP_AT_EXIT);
    }
}

/// Announcements waiting for the thread at most.
const QUEUED: usize = 4096;

impl Announcer {
    /// Starts the thread; it ends when the announcer is dropped (and its current send is
    /// done).
    pub fn start() -> io::Result<Arc<Announcer>> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Announce>(QUEUED);
        std::thread::Builder::new()
            .name("backend-channel".into())
            .spawn(move || announce(rx))?;
        let a = Arc::new(Announcer {
            tx: Mutex::new(tx),
            log: RateLimitedLog::new(10),
            mapped: AtomicU64::new(0),
        });
        if let Ok(mut all) = ANNOUNCERS.lock() {
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&a));
        }
        Ok(a)
    }

    /// Device memory is mapped for a started device (`len` bytes), or not (0).
    pub fn unmap_at_exit(&self, len: u64) {
        self.mapped.store(len, Ordering::Release);
    }

    /// Asks the front-end to map `len` bytes of `file` as device memory (shared memory
    /// region 0).
    pub fn map(&self, file: std::fs::File, len: u64) {
        self.send(Announce::Map { file, len });
    }

    /// A session gave a new backend channel: announcements go there from now on, and
    /// stop when the returned sink (the device's view of this announcer) is dropped.
    pub fn channel(self: &Arc<Self>, backend: Backend) -> Arc<dyn ExportSink> {
        self.send(Announce::Channel(Some(backend)));
        Arc::new(SharedObjects(self.clone()))
    }

    fn send(&self, a: Announce) {
        let Ok(tx) = self.tx.lock() else { return };
        if tx.try_send(a).is_err() {
            self.log.warn(format_args!(
                "shared-object announcement dropped: the front-end does not read its channel"
            ));
        }
    }
}

fn announce(rx: std::sync::mpsc::Receiver<Announce>) {
    let log = RateLimitedLog::new(10);
    let mut channel: Option<Backend> = None;
    for a in rx {
        match a {
            Announce::Channel(b) => channel = b,
            Announce::Update { add, uuid } => {
                let Some(backend) = &channel else { continue };
                let mut m = VhostUserSharedMsg::default();
                m.as_mut_slice().copy_from_slice(&uuid);
                let r = if add {
                    backend.shared_object_add(&m)
                } else {
                    backend.shared_object_remove(&m)
                };
                if let Err(e) = r {
                    log.warn(format_args!("cannot update a shared object: {e}"));
                }
            }
            Announce::Map { file, len } => {
                let Some(backend) = &channel else {
                    log::error!(
                        "device memory cannot reach the guest: the front-end gave no backend \
                         channel (vhost-user BACKEND_REQ) to map it with"
                    );
                    continue;
                };
                let m = VhostUserMMap {
                    shmid: SHM_ID_DEVMEM,
                    len,
                    flags: VhostUserMMapFlags::WRITABLE.bits(),
                    ..Default::default()
                };
                // No acknowledgement is asked for (see set_backend_req_fd): the mapping
                // shows in the memory table the front-end sends next.
                match backend.shmem_map(&m, &file) {
                    Ok(_) => log::info!("asked the front-end to map device memory ({len} bytes)"),
                    Err(e) => log::error!(
                        "cannot map device memory into the guest: {e}. The front-end did not \
                         take a VIRTIO shared memory region: QEMU 11.1 or later with \
                         vhost-user-test-device-pci is needed, or start the daemon with \
                         --attach bar (and an ivshmem-plain function)"
                    ),
                }
            }
            Announce::Unmap { len, done } => {
                if let Some(backend) = &channel {
                    let m = VhostUserMMap {
                        shmid: SHM_ID_DEVMEM,
                        len,
                        ..Default::default()
                    };
                    match backend.shmem_unmap(&m) {
                        Ok(_) => log::info!("asked the front-end to unmap device memory"),
                        Err(e) => log::warn!("cannot unmap device memory: {e}"),
                    }
                }
                let _ = done.try_send(());
            }
        }
    }
}

/// The session's view of the announcer, as the device's export sink.
struct SharedObjects(Arc<Announcer>);

impl ExportSink for SharedObjects {
    fn added(&self, uuid: [u8; 16]) {
        self.0.send(Announce::Update { add: true, uuid });
    }

    fn removed(&self, uuid: [u8; 16]) {
        self.0.send(Announce::Update { add: false, uuid });
    }
}

impl Drop for SharedObjects {
    fn drop(&mut self) {
        // The channel belonged to the session that gave it.
        self.0.send(Announce::Channel(None));
    }
}
