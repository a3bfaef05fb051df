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

use sifbox_engine::Stopping;

use crate::cancel::lock;

/// The job's end of the reaper thread.
pub(super) struct Reaper {
    tx: Mutex<Option<Sender<Stopping>>>,
    /// What did not finish cleanly, for the job's warnings.
    failures: Mutex<Vec<String>>,
    /// Stops handed over and not finished yet.
    pending: Mutex<usize>,
    idle: Condvar,
}

impl Reaper {
    /// The reaper, and what its thread ([`Reaper::run`]) reads.
    pub(super) fn new() -> (Self, Receiver<Stopping>) {
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
    /// here).
    pub(super) fn finish_later(&self, s: Stopping) {
        let tx = lock(&self.tx).clone();
        *lock(&self.pending) += 1;
        let unsent = match tx {
            Some(tx) => tx.send(s).err().map(|e| e.0),
            None => Some(s),
        };
        if let Some(s) = unsent {
            self.finish(s);
        }
    }

    /// The thread: finishes each stop handed over, until the job closes.
    pub(super) fn run(&self, rx: Receiver<Stopping>) {
        for s in rx {
            self.finish(s);
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

    fn finish(&self, s: Stopping) {
        let name = s.name().to_string();
        if let Err(e) = s.finish() {
            lock(&self.failures).push(format!("stopping sandbox {name}: {e}"));
        }
        let mut pending = lock(&self.pending);
        *pending = pending.saturating_sub(1);
        if *pending == 0 {
            self.idle.notify_all();
        }
    }
}
