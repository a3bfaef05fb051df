//! Stopping a sandbox: asking init, waiting for the supervisor, the kill
//! handle eval's cancellation uses.

use rustix::process::{Pid, Signal, WaitOptions};

use super::{Sandbox, SandboxError};
use crate::error::{Error, Result};
use crate::evidence::Evidence;
use crate::protocol::{self, Event, Request};
use crate::runtime;

/// Waits (up to `limit`) until process `pid`, not our child, has exited;
/// returns whether it has.
fn wait_gone(pid: Pid, limit: std::time::Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        // Already gone (or reaped).
        return true;
    };
    let t = Timespec {
        tv_sec: i64::try_from(limit.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&t)), Ok(n) if n > 0)
        || runtime::process_start_time(pid.as_raw_nonzero().get()).is_none()
}

/// Sends the supervisor the signal that makes it kill the sandbox at once.
#[derive(Debug, Clone, Copy)]
pub struct KillHandle(rustix::process::Pid);

impl KillHandle {
    /// Asks the supervisor to kill every process of the sandbox now.
    pub fn kill(&self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::TERM);
    }
}

/// A sandbox whose processes are gone ([`Sandbox::stop_processes`]),
/// its supervisor still finishing.
#[derive(Debug)]
#[must_use = "a stopping sandbox is finished by `finish` (or when dropped)"]
pub struct Stopping(Sandbox);

impl Stopping {
    /// Waits until no mount or runtime dir of the sandbox is left, as
    /// [`Sandbox::stop`] returns.
    pub fn finish(mut self) -> Result<()> {
        self.0.shutdown(std::time::Duration::ZERO)
    }

    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Every call the default seccomp policy denied in the sandbox (see
    /// [`Sandbox::denied`]).
    pub fn denied(&self) -> Vec<crate::denials::Denied> {
        self.0.denied()
    }
}

impl Sandbox {
    /// Stops the sandbox as [`Sandbox::stop`] does, its writable layer
    /// copied first into the dir of `SandboxSpec::keep_layer` (once every
    /// process is gone, so nothing changes under the copy): how a build
    /// step whose layer is on a bounded file system keeps it.
    pub fn stop_keeping_layer(mut self, grace: std::time::Duration) -> Result<()> {
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let conn = self.connect()?;
        protocol::send(&conn, &Request::StopKeepingLayer { grace_ms }, &[])
            .map_err(|e| self.proto(e))?;
        let copied = match protocol::recv::<Event>(&conn) {
            Ok((Event::Ok { time_ns, denied }, _)) => {
                self.stop_inside_ns.set(time_ns);
                if !denied.is_empty() {
                    *self.denied.borrow_mut() = denied;
                }
                Ok(())
            }
            Ok((Event::Error { message, .. }, _)) => {
                Err(crate::supervisor::SupervisorError::Reported { message }.into())
            }
            Ok((other, _)) => Err(SandboxError::UnexpectedAnswer(format!("{other:?}")).into()),
            Err(e) => Err(self.proto(e)),
        };
        // Stopped either way: what is left is the supervisor's exit.
        self.stop_asked.set(true);
        let finished = self.shutdown(grace);
        copied.and(finished)
    }

    /// Stops the sandbox: SIGTERM to every process, SIGKILL after `grace`;
    /// returns once no process, mount or runtime dir of it is left.
    pub fn stop(mut self, grace: std::time::Duration) -> Result<()> {
        self.shutdown(grace)
    }

    /// Stops the sandbox's processes as [`Sandbox::stop`] does, and
    /// returns once init answered that none is left (none can touch its
    /// files or binds any more); its supervisor is still unmounting its
    /// file systems and removing its runtime dir, which
    /// [`Stopping::finish`] waits for. What eval does between rollouts:
    /// the kernel's part of a stop (a few milliseconds of unmounting,
    /// mostly waits) runs beside the next one. When init cannot be reached
    /// the supervisor is signalled instead, and a sandbox that ends by
    /// itself after its last exec is not asked: then only `finish` says
    /// that it is all over.
    pub fn stop_processes(mut self, grace: std::time::Duration) -> Stopping {
        if let Some(pid) = self.supervisor {
            self.ask_stop(pid, grace);
        }
        Stopping(self)
    }

    /// Asks init to stop everything (once), and waits for its answer.
    fn ask_stop(&mut self, pid: Pid, grace: std::time::Duration) {
        if self.stop_asked.get() {
            return;
        }
        self.stop_asked.set(true);
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        if !self.stopping.get() {
            let asked = self.connect().ok().and_then(|c| {
                protocol::send(&c, &Request::Stop { grace_ms }, &[])
                    .ok()
                    .map(|()| c)
            });
            match asked {
                // The reply comes once every process had its grace time
                // and what was left was killed and reaped.
                Some(c) => {
                    if let Ok((Event::Ok { time_ns, denied }, _)) = protocol::recv::<Event>(&c) {
                        self.stop_inside_ns.set(time_ns);
                        // init's count covers every exec of the sandbox
                        // (empty where it could not count: then what this
                        // handle's execs reported stays).
                        if !denied.is_empty() {
                            *self.denied.borrow_mut() = denied;
                        }
                    }
                }
                None => {
                    let _ = rustix::process::kill_process(pid, Signal::TERM);
                }
            }
        }
    }

    pub(super) fn shutdown(&mut self, grace: std::time::Duration) -> Result<()> {
        let Some(pid) = self.supervisor else {
            return Ok(());
        };
        self.ask_stop(pid, grace);
        self.supervisor = None;
        let inside_ns = self.stop_inside_ns.get();
        if self.is_child {
            loop {
                match rustix::process::waitpid(Some(pid), WaitOptions::empty()) {
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        return Err(Error::io(format!("waiting for sandbox {}", self.name), e))
                    }
                    Ok(_) => break,
                }
            }
        } else if !wait_gone(pid, std::time::Duration::from_secs(10)) {
            // Stop did not take: end it the hard way (outer kills init,
            // and the kernel the rest of the pid namespace).
            let _ = rustix::process::kill_process(pid, Signal::TERM);
            if !wait_gone(pid, std::time::Duration::from_secs(10)) {
                return Err(Error::Protocol {
                    name: self.name.clone(),
                    why: format!(
                        "its supervisor (pid {pid:?}) does not stop; kill it and run `sifbox gc`"
                    ),
                });
            }
        }
        if let Some(path) = self.evidence_reached() {
            // A record inside the runtime dir goes with it.
            if !path.starts_with(&self.dir) {
                Evidence::record_stop(&path, inside_ns, &self.denied.borrow())?;
            }
        }
        // Only if no other sandbox has taken the name since the
        // supervisor removed the dir (our own hold on it goes first).
        self.reservation.replace(None);
        runtime::remove_if_dead(&self.dir).map(|_| ())
    }

    /// Tells the supervisor to tear everything down now (used on SIGINT/SIGTERM).
    pub fn kill_handle(&self) -> Option<KillHandle> {
        self.supervisor.map(KillHandle)
    }
}
