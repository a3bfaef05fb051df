//! Stopping a job: Ctrl-C (or a library user) cancels it, which kills every
//! sandbox of the job at once, the build steps' sandboxes included; the
//! workers then stop and remove them, record their rollouts as interrupted
//! and start nothing new.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;

use sifbox_engine::sandbox::KillHandle;

/// A job's cancellation token, shared by its workers and whoever stops it.
#[derive(Debug, Default)]
pub struct Cancel {
    cancelled: AtomicBool,
    signal: AtomicI32,
    next: AtomicU64,
    /// The sandboxes of running rollouts.
    sandboxes: Mutex<HashMap<u64, KillHandle>>,
    /// The worker threads (their ids): the sandboxes of builds are their
    /// children.
    threads: Mutex<Vec<i32>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Whether the job was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// The signal that cancelled the job (0: none, or not a signal).
    pub fn signal(&self) -> i32 {
        self.signal.load(Ordering::SeqCst)
    }

    /// Cancels the job (because of `signal`, 0 for none): every sandbox of
    /// it is killed now. Safe to call again (it kills what started since).
    pub fn cancel(&self, signal: i32) {
        if signal != 0 {
            let _ = self
                .signal
                .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        }
        self.cancelled.store(true, Ordering::SeqCst);
        self.kill_all();
    }

    /// Kills every sandbox the job's workers have running.
    pub fn kill_all(&self) {
        for h in lock(&self.sandboxes).values() {
            h.kill();
        }
        let threads = lock(&self.threads).clone();
        for tid in threads {
            kill_sandboxes_of_thread(tid);
        }
    }

    pub(crate) fn register(&self, h: KillHandle) -> u64 {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        lock(&self.sandboxes).insert(id, h);
        id
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.sandboxes).remove(&id);
    }

    pub(crate) fn add_thread(&self, tid: i32) {
        lock(&self.threads).push(tid);
    }

    pub(crate) fn remove_thread(&self, tid: i32) {
        lock(&self.threads).retain(|t| *t != tid);
    }
}

/// The id of the calling thread.
pub(crate) fn current_tid() -> i32 {
    sifbox_engine::supervisor::current_tid()
}

/// See [`sifbox_engine::supervisor::kill_sandboxes_of_thread`].
pub(crate) fn kill_sandboxes_of_thread(tid: i32) -> usize {
    sifbox_engine::supervisor::kill_sandboxes_of_thread(tid)
}
