// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! DMA engines: a pool of worker threads that run commands, possibly out of order, with
//! fences. A fenced job starts only after every job submitted before it has completed.

use std::collections::BTreeSet;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

type Work = Box<dyn FnOnce() + Send>;

struct Job {
    seq: u64,
    fence: bool,
    work: Work,
}

#[derive(Default)]
struct Tracker {
    next_seq: u64,
    in_flight: BTreeSet<u64>,
    /// Threads waiting on `changed` (fences, drains): without any, a finish wakes nobody.
    waiting: usize,
}

impl Tracker {
    fn begin(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.insert(seq);
        seq
    }
}

/// Work done outside the engines but ordered with theirs (a request run inline on the
/// ring thread): a fence submitted after it waits until it is dropped.
pub struct Ticket {
    shared: Arc<Shared>,
    seq: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        finish(&self.shared, self.seq);
    }
}

struct Shared {
    tracker: Mutex<Tracker>,
    changed: Condvar,
}

pub struct Dispatcher {
    tx: Mutex<Option<Sender<Job>>>,
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Dispatcher {
    pub fn new(engines: usize) -> std::io::Result<Dispatcher> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let shared = Arc::new(Shared {
            tracker: Mutex::new(Tracker::default()),
            changed: Condvar::new(),
        });
        let mut workers = Vec::new();
        for i in 0..engines.max(1) {
            let rx = rx.clone();
            let shared = shared.clone();
            workers.push(
                std::thread::Builder::new()
                    .name(format!("dma{i}"))
                    .spawn(move || worker(rx, shared))?,
            );
        }
        Ok(Dispatcher {
            tx: Mutex::new(Some(tx)),
            shared,
            workers: Mutex::new(workers),
        })
    }

    /// Queues `work`; returns false when the dispatcher is shut down.
    pub fn submit(&self, fence: bool, work: impl FnOnce() + Send + 'static) -> bool {
        let Ok(tx) = self.tx.lock() else { return false };
        let Some(tx) = tx.as_ref() else { return false };
        let seq = {
            let Ok(mut t) = self.shared.tracker.lock() else {
                return false;
            };
            t.begin()
        };
        let job = Job {
            seq,
            fence,
            work: Box::new(work),
        };
        if tx.send(job).is_err() {
            self.finish(seq);
            return false;
        }
        true
    }

    fn finish(&self, seq: u64) {
        finish(&self.shared, seq);
    }

    /// Counts work that runs elsewhere as in flight until the ticket is dropped, so that
    /// fences (and drains) wait for it as for the engines' jobs.
    pub fn ticket(&self) -> Ticket {
        let seq = match self.shared.tracker.lock() {
            Ok(mut t) => t.begin(),
            Err(p) => p.into_inner().begin(),
        };
        Ticket {
            shared: self.shared.clone(),
            seq,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.shared
            .tracker
            .lock()
            .map(|t| t.in_flight.len())
            .unwrap_or(0)
    }

    /// Waits until every submitted job has completed, up to `timeout`; true when drained.
    pub fn drain(&self, timeout: Duration) -> bool {
        let Ok(mut t) = self.shared.tracker.lock() else {
            return false;
        };
        t.waiting += 1;
        let Ok((mut t, _)) = self
            .shared
            .changed
            .wait_timeout_while(t, timeout, |t| !t.in_flight.is_empty())
        else {
            return false;
        };
        t.waiting -= 1;
        t.in_flight.is_empty()
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut w) = self.workers.lock() {
            for h in w.drain(..) {
                let _ = h.join();
            }
        }
    }
}

fn finish(shared: &Shared, seq: u64) {
    let wake = match shared.tracker.lock() {
        Ok(mut t) => {
            t.in_flight.remove(&seq);
            t.waiting > 0
        }
        Err(_) => true,
    };
    if wake {
        shared.changed.notify_all();
    }
}

fn worker(rx: Arc<Mutex<Receiver<Job>>>, shared: Arc<Shared>) {
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        if job.fence {
            // Jobs leave the channel in order, so every earlier job is running or fenced
            // behind an even earlier one (and inline work ends by itself): this wait
            // always ends.
            if let Ok(mut t) = shared.tracker.lock() {
                t.waiting += 1;
                if let Ok(mut t) = shared
                    .changed
                    .wait_while(t, |t| t.in_flight.first() != Some(&job.seq))
                {
                    t.waiting -= 1;
                }
            }
        }
        // A job that panics (a bug) must not take its engine, or every later fence, with
        // it: it is logged and counted as finished.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job.work)).is_err() {
            log::error!("a DMA engine job panicked; its request is not answered");
        }
        finish(&shared, job.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn fence_waits_for_all_earlier_jobs() {
        let d = Dispatcher::new(4).unwrap();
        let done = Arc::new(AtomicU64::new(0));
        for _ in 0..3 {
            let done = done.clone();
            d.submit(false, move || {
                std::thread::sleep(Duration::from_millis(50));
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        let seen = Arc::new(AtomicU64::new(99));
        let (done2, seen2) = (done.clone(), seen.clone());
        d.submit(true, move || {
            seen2.store(done2.load(Ordering::SeqCst), Ordering::SeqCst)
        });
        assert!(d.drain(Duration::from_secs(5)));
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert_eq!(d.in_flight(), 0);
    }

    #[test]
    fn fence_waits_for_tickets_taken_before_it() {
        let d = Dispatcher::new(1).unwrap();
        let ticket = d.ticket();
        let (tx, rx) = std::sync::mpsc::channel();
        d.submit(true, move || {
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(ticket);
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
        assert!(d.drain(Duration::from_secs(5)));
    }

    #[test]
    fn a_panicking_job_neither_kills_its_engine_nor_blocks_fences() {
        let d = Dispatcher::new(1).unwrap();
        d.submit(false, || panic!("a bug"));
        let (tx, rx) = std::sync::mpsc::channel();
        d.submit(true, move || {
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
        assert!(d.drain(Duration::from_secs(5)));
        assert_eq!(d.in_flight(), 0);
    }

    #[test]
    fn unfenced_jobs_run_concurrently() {
        let d = Dispatcher::new(2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (tx2, rx2) = std::sync::mpsc::channel::<()>();
        // The first job blocks until the second has run: only possible with two engines.
        d.submit(false, move || {
            let _ = rx2.recv_timeout(Duration::from_secs(5));
            let _ = tx.send(());
        });
        d.submit(false, move || {
            let _ = tx2.send(());
        });
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
        assert!(d.drain(Duration::from_secs(5)));
    }
}
