//! The memory watchdog of a sandbox without a memory cgroup (outer's):
//! samples, kills above the limit, records `usage.json`.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::process::{Pid, Signal};

/// The memory watchdog of a sandbox without a memory cgroup: outer samples
/// what the sandbox's processes hold alone (their private resident pages)
/// plus what its tmpfs mounts hold, faster as the headroom shrinks, and
/// kills the largest process when the sum passes the limit, as the OOM
/// killer would; `usage.json` in the runtime dir records the peak and the
/// kills. SIGUSR1 starts a new peak.
pub(super) struct Watchdog {
    limit: u64,
    init: Pid,
    dir: PathBuf,
    /// The sandbox's /proc, from init.
    pub(super) proc: Option<rustix::fs::Dir>,
    /// The roots of the writable layer's tmpfs (the overlay's statfs is its
    /// upper layer's) and /dev/shm, from init.
    pub(super) tmpfs: Vec<OwnedFd>,
    pub(super) reset: OwnedFd,
    /// init's word on the sandbox going idle or busy (see [`Activity`]).
    pub(super) activity: Option<OwnedFd>,
    /// The sandbox is idle: no sampling until init says it is busy.
    pub(super) idle: bool,
    pub(super) next_ms: u64,
    pub(super) armed: bool,
    peak: u64,
    recorded_peak: u64,
    /// The last sample's total.
    last_used: u64,
    pub(super) oom_kills: u64,
    /// Peaks started on request (the client waits for the count to move).
    resets: u64,
}

impl Watchdog {
    pub(super) fn new(
        limit: u64,
        init: Pid,
        dir: PathBuf,
        reset: OwnedFd,
        activity: Option<OwnedFd>,
    ) -> Watchdog {
        Watchdog {
            limit,
            init,
            dir,
            proc: None,
            tmpfs: Vec::new(),
            reset,
            activity,
            idle: false,
            next_ms: 20,
            armed: false,
            peak: 0,
            recorded_peak: 0,
            last_used: 0,
            oom_kills: 0,
            resets: 0,
        }
    }

    /// Samples from now on (once init is set up).
    pub(super) fn arm(&mut self) {
        self.armed = true;
        self.sample();
    }

    pub(super) fn armed(&self) -> bool {
        self.armed
    }

    /// Reads what init said; whether the sandbox went from idle to busy or
    /// back (the last word counts). EOF (init is gone) means busy.
    pub(super) fn activity_changed(&mut self) -> bool {
        let Some(a) = &self.activity else {
            return false;
        };
        let mut b = [0u8; 64];
        let mut idle = self.idle;
        loop {
            match rustix::io::read(a, &mut b) {
                Ok(0) => {
                    idle = false;
                    self.activity = None;
                    break;
                }
                Ok(n) => idle = b[n - 1] == b'I',
                Err(_) => break,
            }
        }
        let changed = idle != self.idle;
        self.idle = idle;
        changed
    }

    /// Whether SIGUSR1 came (a new peak); drains it.
    pub(super) fn reset_asked(&mut self) -> bool {
        let mut b = [0u8; 16];
        let mut asked = false;
        while let Ok(n) = rustix::io::read(&self.reset, &mut b) {
            if n == 0 {
                break;
            }
            asked = true;
        }
        if asked {
            self.peak = 0;
            self.recorded_peak = 0;
            self.resets += 1;
        }
        asked
    }

    pub(super) fn sample(&mut self) {
        use crate::limits::{self, Verdict};
        let init = self.init.as_raw_nonzero().get();
        // The sandbox's own /proc lists its processes (pid 1 is init);
        // without it, the host's tree below init.
        let procs = match &mut self.proc {
            Some(dir) => limits::ns_memory(dir),
            None => limits::tree_memory(Path::new("/proc"), init)
                .into_iter()
                .map(|p| limits::ProcMemory {
                    pid: if p.pid == init { 1 } else { p.pid },
                    ..p
                })
                .collect(),
        };
        let tmpfs: u64 = self.tmpfs.iter().map(limits::used_bytes).sum();
        let used = procs.iter().map(|p| p.private).sum::<u64>() + tmpfs;
        self.peak = self.peak.max(used);
        let last_used = std::mem::replace(&mut self.last_used, used);
        match limits::verdict(self.limit, used, tmpfs, &procs, 1) {
            Verdict::Kill(pid) => {
                let host = if self.proc.is_some() {
                    limits::host_pid(init, pid)
                } else if pid == 1 {
                    Some(init)
                } else {
                    Some(pid)
                };
                // Counted before the kill, so that whoever sees the
                // process die sees the count too.
                self.oom_kills += 1;
                self.record();
                if let Some(p) = host.and_then(Pid::from_raw) {
                    let _ = rustix::process::kill_process(p, Signal::KILL);
                }
                self.next_ms = 20;
            }
            Verdict::Wait(headroom) => {
                let moved = used.abs_diff(last_used) >= 1 << 20;
                self.next_ms = limits::next_wait_ms(self.next_ms, headroom, moved);
                // The record follows the peak in steps of 1 MiB.
                if self.peak >= self.recorded_peak + (1 << 20) {
                    self.record();
                }
            }
        }
    }

    /// Writes usage.json (a new file renamed into place).
    pub(super) fn record(&self) {
        let usage = crate::protocol::Usage {
            cpu_ns: None,
            memory_peak: Some(self.peak),
            oom_kills: self.oom_kills,
            peak_resets: self.resets,
        };
        let path = self.dir.join(crate::limits::USAGE_FILE);
        let tmp = self.dir.join(".usage.json.tmp");
        let ok = serde_json::to_vec(&usage)
            .ok()
            .is_some_and(|d| std::fs::write(&tmp, d).is_ok())
            && std::fs::rename(&tmp, &path).is_ok();
        if !ok {
            tracing::debug!("writing {}", path.display());
        }
    }
}
