//! Finishing the stops of rollouts' sandboxes beside the next rollouts.
//!
//! A rollout's sandbox is stopped with [`Sandbox::stop_processes`]: the
//! rollout goes on (its result written, the next one started) once no
//! process of the sandbox is left, while its supervisor unmounts the
//! sandbox's file systems and removes its runtime dir, which is mostly the
//! kernel waiting (for RCU, for writeback, for a disk's discards: 2 to 6
//! ms a sandbox). A thread of the job waits for those supervisors; the job
//! ends only after the last one did, so nothing of a job outlives it. A
//! worker thread waits for them too before it ends: a supervisor gets
//! SIGKILL when the thread that started it ends (its parent-death signal),
//! which would leave its runtime dir behind.
//!
//! [`Sandbox::stop_processes`]: sifbox_engine::Sandbox::stop_processes

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Condvar, Mutex};

use sifbox_engine::disk::Removal;
use sifbox_engine::Stopping;

/// A stop to finish, and the sandbox's disk-backed layer to remove after.
type Job = (Stopping, Option<Removal>);

use crate::cancel::lock;

/// The job's end of the reaper thread.
pub(super) struct Reaper {
    tx: Mutex<Option<Sender<Job>>>,
    /// What did not finish cleanly, for the job's warnings.
    failures: Mutex<Vec<String>>,
    /// Stops handed over and not finished yet.
    pending: Mutex<usize>,
    idle: Condvar,
}

impl Reaper {
    /// The reaper, and what its thread ([`Reaper::run`]) reads.
    pub(super) fn new() -> (Self, Receiver<Job>) {
        let (tx, rx) = channel();
        (
            Reaper {
                tx: Mutex::new(Some(tx)),
                failures: Mutex::new(Vec::new()),
                pending: Mutex::new(0),
                idle: Condvar::new(),
            },
            rx,
        )
    }

    /// Hands `s` to the thread (or, once the job has closed it, finishes it
    /// here); `layer` is removed once it is finished.
    pub(super) fn finish_later(&self, s: Stopping, layer: Option<Removal>) {
        let tx = lock(&self.tx).clone();
        *lock(&self.pending) += 1;
        let unsent = match tx {
            Some(tx) => tx.send((s, layer)).err().map(|e| e.0),
            None => Some((s, layer)),
        };
        if let Some(job) = unsent {
            self.finish(job);
        }
    }

    /// The thread: finishes each stop handed over, until the job closes.
    pub(super) fn run(&self, rx: Receiver<Job>) {
        for job in rx {
            self.finish(job);
        }
    }

    /// Waits until every stop handed over is finished (a worker, before it
    /// ends).
    pub(super) fn wait_idle(&self) {
        let mut pending = lock(&self.pending);
        while *pending > 0 {
            pending = self
                .idle
                .wait(pending)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// No more stops: the thread ends after the ones handed over.
    pub(super) fn close(&self) {
        lock(&self.tx).take();
    }

    /// What did not finish cleanly.
    pub(super) fn failures(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.failures))
    }

    fn finish(&self, (s, layer): Job) {
        let name = s.name().to_string();
        match s.finish() {
            // Nothing of the sandbox is left to change the layer's tree.
            Ok(()) => {
                if let Some(Err(e)) = layer.map(Removal::remove) {
                    lock(&self.failures).push(format!(
                        "removing the disk-backed layer of sandbox {name}: {e} (its file system is not reused)"
                    ));
                }
            }
            // A layer whose sandbox may live on stays (its file system
            // taken, not reused).
            Err(e) => lock(&self.failures).push(format!("stopping sandbox {name}: {e}")),
        }
        let mut pending = lock(&self.pending);
        *pending = pending.saturating_sub(1);
        if *pending == 0 {
            self.idle.notify_all();
        }
    }
}
