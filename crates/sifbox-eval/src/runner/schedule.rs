//! Which rollout a free worker runs next, so that no worker idles while a
//! task is runnable: first a rollout of a task whose image is ready; else
//! the first rollout of a task nobody prepares yet (the worker builds its
//! image, while others run what is ready); it waits only when every task
//! left is being prepared by another worker.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How far a task's image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No rollout of it has started.
    Waiting,
    /// A worker is making its image (its first rollout).
    Preparing,
    /// Its image is made, or failed for good: its rollouts run at once.
    Ready,
}

#[derive(Debug)]
struct State {
    names: Vec<String>,
    pending: Vec<VecDeque<u32>>,
    phase: Vec<Phase>,
}

/// The job's queue of rollouts, (task index, attempt).
#[derive(Debug)]
pub(super) struct Scheduler {
    state: Mutex<State>,
    changed: Condvar,
}

impl Scheduler {
    /// A queue of `todo` ((task index, attempt), in plan order) over the
    /// tasks named `names`.
    pub(super) fn new(names: Vec<String>, todo: &[(usize, u32)]) -> Scheduler {
        let mut pending = vec![VecDeque::new(); names.len()];
        for &(ti, attempt) in todo {
            if let Some(q) = pending.get_mut(ti) {
                q.push_back(attempt);
            }
        }
        let phase = vec![Phase::Waiting; names.len()];
        Scheduler {
            state: Mutex::new(State {
                names,
                pending,
                phase,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What to run now, without waiting: `Err(())` when the only rollouts
    /// left belong to tasks another worker is preparing.
    fn take(st: &mut State) -> Result<Option<(usize, u32)>, ()> {
        let n = st.pending.len();
        let ready = (0..n).find(|&i| st.phase[i] == Phase::Ready && !st.pending[i].is_empty());
        if let Some(ti) = ready {
            return Ok(st.pending[ti].pop_front().map(|a| (ti, a)));
        }
        let fresh = (0..n).find(|&i| st.phase[i] == Phase::Waiting && !st.pending[i].is_empty());
        if let Some(ti) = fresh {
            st.phase[ti] = Phase::Preparing;
            return Ok(st.pending[ti].pop_front().map(|a| (ti, a)));
        }
        if st.pending.iter().all(VecDeque::is_empty) {
            Ok(None)
        } else {
            Err(())
        }
    }

    /// The next rollout for a free worker, waiting while every task left is
    /// being prepared; `None` when nothing is left or `stop()` says so.
    pub(super) fn next(&self, stop: impl Fn() -> bool) -> Option<(usize, u32)> {
        let mut st = self.lock();
        loop {
            if stop() {
                return None;
            }
            match Self::take(&mut st) {
                Ok(next) => return next,
                Err(()) => {
                    st = self
                        .changed
                        .wait_timeout(st, Duration::from_millis(100))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// The image of task `name` is ready (or failed): its other rollouts
    /// may run.
    pub(super) fn ready(&self, name: &str) {
        let mut st = self.lock();
        let mut changed = false;
        for i in 0..st.names.len() {
            if st.names[i] == name && st.phase[i] != Phase::Ready {
                st.phase[i] = Phase::Ready;
                changed = true;
            }
        }
        drop(st);
        if changed {
            self.changed.notify_all();
        }
    }

    /// Task `ti`'s rollout ended (also one that stopped before its image:
    /// its task must not stay "being prepared").
    pub(super) fn finished(&self, ti: usize) {
        let name = self.lock().names.get(ti).cloned();
        if let Some(name) = name {
            self.ready(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(tasks: usize, attempts: u32) -> Scheduler {
        let names = (0..tasks).map(|i| format!("t{i}")).collect();
        let todo: Vec<(usize, u32)> = (0..tasks)
            .flat_map(|t| (1..=attempts).map(move |a| (t, a)))
            .collect();
        Scheduler::new(names, &todo)
    }

    #[test]
    fn a_second_worker_prepares_another_task_instead_of_waiting() {
        let s = sched(3, 3);
        let never = || false;
        // Worker 1 takes t0 (and builds it); worker 2 does not wait on it.
        assert_eq!(s.next(never), Some((0, 1)));
        assert_eq!(s.next(never), Some((1, 1)));
        // t0 is ready: its rollouts come before a third build.
        s.ready("t0");
        assert_eq!(s.next(never), Some((0, 2)));
        assert_eq!(s.next(never), Some((0, 3)));
        assert_eq!(s.next(never), Some((2, 1)));
        s.finished(1);
        assert_eq!(s.next(never), Some((1, 2)));
        assert_eq!(s.next(never), Some((1, 3)));
        s.ready("t2");
        assert_eq!(s.next(never), Some((2, 2)));
        assert_eq!(s.next(never), Some((2, 3)));
        assert_eq!(s.next(never), None);
    }

    #[test]
    fn a_worker_waits_only_for_tasks_being_prepared_and_wakes_when_ready() {
        let s = std::sync::Arc::new(sched(1, 2));
        assert_eq!(s.next(|| false), Some((0, 1)));
        let s2 = std::sync::Arc::clone(&s);
        let waiter = std::thread::spawn(move || s2.next(|| false));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "it should wait for t0's image");
        s.ready("t0");
        assert_eq!(waiter.join().ok().flatten(), Some((0, 2)));
        // Stopped: no more.
        let s = sched(1, 2);
        assert_eq!(s.next(|| false), Some((0, 1)));
        assert_eq!(s.next(|| true), None);
    }
}
