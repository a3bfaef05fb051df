//! init's exec workers: which is free, which finished, which stays warm.
//! Decisions only; the forks are [`super::serve`]'s.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::process::{Pid, Signal};

use crate::protocol::{self, Request};

/// A worker: a child of init that serves execs and transfers one after
/// another, each to its end (an exec's command and everything it started),
/// so that its page tables are warm and no request after the first pays
/// for a fork.
pub(super) struct Worker {
    pid: Pid,
    /// init's end of the socketpair: jobs go down, a byte per finished job
    /// comes back; closing it tells an idle worker to exit.
    chan: UnixStream,
    busy: bool,
    /// When init rescues the worker from its exec ([`Pool::overdue`]).
    deadline: Option<std::time::Instant>,
}

/// How long past an exec's time limit init waits for its worker to report
/// before it rescues the worker.
pub(super) const RESCUE_AFTER: Duration = Duration::from_secs(1);

/// Why no worker took a request.
#[derive(Debug, thiserror::Error)]
pub(super) enum PoolError {
    #[error("socketpair: {0}")]
    Socketpair(std::io::Error),
    #[error("{0}")]
    Fork(sifbox_sys::Error),
    #[error("no exec worker is free")]
    NoneFree,
    #[error("handing the request to a worker: {0}")]
    Handoff(protocol::ProtocolError),
}

pub(super) enum NewWorker {
    Parent(Worker),
    Child(UnixStream),
}

/// Forks an exec worker connected to init by a socketpair.
pub(super) fn new_worker() -> std::result::Result<NewWorker, PoolError> {
    let (mine, theirs) = UnixStream::pair().map_err(PoolError::Socketpair)?;
    match sifbox_sys::fork().map_err(PoolError::Fork)? {
        sifbox_sys::Forked::Child => {
            drop(mine);
            Ok(NewWorker::Child(theirs))
        }
        sifbox_sys::Forked::Parent(pid) => Ok(NewWorker::Parent(Worker {
            pid,
            chan: mine,
            busy: false,
            deadline: None,
        })),
    }
}

/// init's exec workers, and every decision about them: which is free,
/// which finished, which stays warm, which goes. The forks and the polling
/// are `serve`'s; the pool only holds the channels, so its decisions are
/// unit-tested with socketpairs and no process.
#[derive(Default)]
pub(super) struct Pool {
    workers: Vec<Worker>,
}

impl Pool {
    pub(super) fn len(&self) -> usize {
        self.workers.len()
    }

    /// The workers' pids.
    pub(super) fn pids(&self) -> impl Iterator<Item = Pid> + '_ {
        self.workers.iter().map(|w| w.pid)
    }

    pub(super) fn any_busy(&self) -> bool {
        self.workers.iter().any(|w| w.busy)
    }

    pub(super) fn has_idle(&self) -> bool {
        self.workers.iter().any(|w| !w.busy)
    }

    pub(super) fn add(&mut self, w: Worker) {
        self.workers.push(w);
    }

    /// Forgets the workers among `pids` (reaped: they died).
    pub(super) fn reaped(&mut self, pids: &[Pid]) {
        self.workers.retain(|w| !pids.contains(&w.pid));
    }

    /// The workers' channels, in order (for poll: index `i` is worker `i`).
    pub(super) fn channels(&self) -> impl Iterator<Item = &UnixStream> {
        self.workers.iter().map(|w| &w.chan)
    }

    /// Worker `i`'s channel is readable: a byte says its job is done (it is
    /// free again; its pid is returned), EOF or an error that it is gone.
    pub(super) fn finished(&mut self, i: usize) -> Option<Pid> {
        let w = self.workers.get_mut(i)?;
        let mut b = [0u8; 16];
        match rustix::io::read(&w.chan, &mut b) {
            Ok(n) if n > 0 => {
                w.busy = false;
                w.deadline = None;
                Some(w.pid)
            }
            _ => {
                self.workers.remove(i);
                None
            }
        }
    }

    /// One free worker is kept warm; the other free ones go (their channel
    /// closes, and a worker that reads EOF exits).
    pub(super) fn trim_idle(&mut self) {
        let mut idle_seen = false;
        self.workers.retain(|w| {
            if w.busy {
                return true;
            }
            let keep = !idle_seen;
            idle_seen = true;
            keep
        });
    }

    /// The soonest time a busy worker is to be rescued.
    pub(super) fn next_deadline(&self) -> Option<std::time::Instant> {
        self.workers.iter().filter_map(|w| w.deadline).min()
    }

    /// The busy workers whose exec is past its time limit and
    /// [`RESCUE_AFTER`] more without a word (stopped from inside, most
    /// likely): their pids, to rescue; each is due again a moment later,
    /// until it reports.
    pub(super) fn overdue(&mut self, now: std::time::Instant) -> Vec<Pid> {
        let mut out = Vec::new();
        for w in &mut self.workers {
            if w.busy && w.deadline.is_some_and(|d| d <= now) {
                w.deadline = Some(now + RESCUE_AFTER);
                out.push(w.pid);
            }
        }
        out
    }

    /// Hands an exec to a free worker; returns its pid. A worker that
    /// cannot take it is dropped from the pool.
    pub(super) fn dispatch(
        &mut self,
        conn: &UnixStream,
        req: &Request,
        fds: &[OwnedFd],
    ) -> std::result::Result<Pid, PoolError> {
        use std::os::fd::AsFd;
        let i = self
            .workers
            .iter()
            .position(|w| !w.busy)
            .ok_or(PoolError::NoneFree)?;
        let mut passed = vec![conn.as_fd()];
        passed.extend(fds.iter().map(AsFd::as_fd));
        // A free worker that a process of the sandbox stopped would sit on
        // the request: it goes on first.
        let _ = rustix::process::kill_process(self.workers[i].pid, Signal::CONT);
        if let Err(e) = protocol::send(&self.workers[i].chan, req, &passed) {
            self.workers.remove(i);
            return Err(PoolError::Handoff(e));
        }
        self.workers[i].busy = true;
        self.workers[i].deadline = match req {
            Request::Exec(exec) => exec
                .timeout_ms
                .map(|ms| std::time::Instant::now() + Duration::from_millis(ms) + RESCUE_AFTER),
            _ => None,
        };
        Ok(self.workers[i].pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ExecRequest;
    use std::io::{Read, Write};

    fn pid(n: i32) -> Pid {
        Pid::from_raw(n).expect("a valid pid")
    }

    /// A worker of the pool and the far end of its channel (the worker's).
    fn worker(n: i32) -> (Worker, UnixStream) {
        let (chan, far) = UnixStream::pair().expect("socketpair");
        (
            Worker {
                pid: pid(n),
                chan,
                busy: false,
                deadline: None,
            },
            far,
        )
    }

    #[test]
    fn a_free_worker_is_reused_and_one_stays_warm() {
        let mut pool = Pool::default();
        let (w1, mut far1) = worker(101);
        let (w2, mut far2) = worker(102);
        pool.add(w1);
        pool.add(w2);
        let (conn, _client) = UnixStream::pair().expect("socketpair");
        let req = Request::Exec(ExecRequest::default());
        assert_eq!(pool.dispatch(&conn, &req, &[]).ok(), Some(pid(101)));
        assert!(pool.any_busy() && pool.has_idle());
        assert_eq!(pool.dispatch(&conn, &req, &[]).ok(), Some(pid(102)));
        assert!(!pool.has_idle());
        let none = pool.dispatch(&conn, &req, &[]);
        assert!(matches!(none, Err(PoolError::NoneFree)), "none is free");
        // The job reached the worker, with the client's connection.
        let (_, fds) = protocol::recv::<Request>(&far1).expect("the job");
        assert_eq!(fds.len(), 1);
        // Worker 1 says it is done: free again, and the next exec is its.
        far1.write_all(b".").expect("write");
        assert_eq!(pool.finished(0), Some(pid(101)));
        assert_eq!(pool.dispatch(&conn, &req, &[]).ok(), Some(pid(101)));
        // Both done: one stays warm, the other's channel closes.
        far1.write_all(b".").expect("write");
        far2.write_all(b".").expect("write");
        assert_eq!(pool.finished(1), Some(pid(102)));
        assert_eq!(pool.finished(0), Some(pid(101)));
        pool.trim_idle();
        assert_eq!(pool.len(), 1);
        let mut rest = Vec::new();
        far2.read_to_end(&mut rest).expect("read");
        let _ = far1;
        // A busy worker is never trimmed.
        assert_eq!(pool.dispatch(&conn, &req, &[]).ok(), Some(pid(101)));
        pool.trim_idle();
        assert_eq!(pool.len(), 1);
    }

    #[test]
    fn an_exec_past_its_limit_makes_its_worker_due_for_rescue_until_it_reports() {
        let mut pool = Pool::default();
        let (w1, mut far1) = worker(301);
        pool.add(w1);
        let (conn, _client) = UnixStream::pair().expect("socketpair");
        // A transfer has no limit: never due.
        let copy = Request::Remove { path: "/x".into() };
        assert_eq!(pool.dispatch(&conn, &copy, &[]).ok(), Some(pid(301)));
        assert_eq!(pool.next_deadline(), None);
        far1.write_all(b".").expect("write");
        assert_eq!(pool.finished(0), Some(pid(301)));
        let exec = Request::Exec(ExecRequest {
            timeout_ms: Some(100),
            ..ExecRequest::default()
        });
        let t = std::time::Instant::now();
        assert_eq!(pool.dispatch(&conn, &exec, &[]).ok(), Some(pid(301)));
        let due = pool.next_deadline().expect("a deadline");
        assert!(due >= t + Duration::from_millis(100) + RESCUE_AFTER);
        assert!(pool.overdue(t).is_empty());
        assert_eq!(pool.overdue(due), vec![pid(301)]);
        // Due again a moment later while it says nothing...
        assert!(pool.next_deadline().expect("again") >= due + RESCUE_AFTER);
        // ...and never once it reported.
        far1.write_all(b".").expect("write");
        assert_eq!(pool.finished(0), Some(pid(301)));
        assert_eq!(pool.next_deadline(), None);
        assert!(pool.overdue(due + RESCUE_AFTER * 10).is_empty());
    }

    #[test]
    fn a_worker_that_went_away_leaves_the_pool() {
        let mut pool = Pool::default();
        let (w1, far1) = worker(201);
        let (w2, _far2) = worker(202);
        pool.add(w1);
        pool.add(w2);
        // EOF on its channel: gone.
        drop(far1);
        assert_eq!(pool.finished(0), None);
        assert_eq!(pool.len(), 1);
        // Reaped: gone too.
        pool.reaped(&[pid(202)]);
        assert_eq!(pool.len(), 0);
        assert!(!pool.has_idle() && !pool.any_busy());
    }
}
