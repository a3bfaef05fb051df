//! What the supervisor's processes hand each other: outer's and init's
//! handshake channel ([`Nest`]), the layer init keeps for its exec server
//! to copy out at stop ([`KeptLayer`]), and init's side of the watchdog's
//! idle protocol ([`Activity`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use rustix::process::Pid;

use super::pool::Pool;

/// init's side of the nested-namespace handshake: a request (with the fds
/// of its tmpfs mounts for the watchdog), then outer's "mapped".
pub(super) struct Nest(pub(super) UnixStream);

/// A layer to keep when the sandbox stops: its upper dir and where to.
pub(super) struct KeptLayer {
    pub(super) upper: OwnedFd,
    pub(super) dst: OwnedFd,
}

/// init's side of the watchdog's idle protocol. The sandbox is idle when
/// nothing is in it but init and its idle workers: then nothing in it can
/// allocate memory until init gives work out, and outer's watchdog need
/// not wake at all. init says so (`I`) when it sees it, and says `B`
/// before it gives work out again; a sandbox with a watchdog costs the
/// host no wake-ups while it waits for its next command.
///
/// What is counted is every process of the sandbox's pid namespace (from
/// its /proc), so nothing a command leaves running, detached or
/// reparented to init, is missed; a command cannot write to the pipe.
pub(super) struct Activity {
    pub(super) pipe: OwnedFd,
    pub(super) proc: rustix::fs::Dir,
    pub(super) idle: bool,
}

impl Activity {
    /// Work starts (an exec, a transfer): the watchdog samples again.
    pub(super) fn busy(&mut self) {
        if self.idle {
            self.idle = false;
            let _ = rustix::io::write(&self.pipe, b"B");
        }
    }

    /// Tells outer when the sandbox has become idle: no exec running, no
    /// detached one, and no process but init and `workers` (all idle).
    pub(super) fn check(&mut self, workers: &Pool, detached: &HashMap<String, Pid>) {
        if self.idle || !detached.is_empty() || workers.any_busy() {
            return;
        }
        if crate::limits::ns_pids(&mut self.proc).len() == 1 + workers.len() {
            self.idle = true;
            let _ = rustix::io::write(&self.pipe, b"I");
        }
    }
}
