//! The client side of a native sandbox: start it, run commands in it, stop it.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use rustix::process::{Pid, Signal};

use crate::denials::Denied;
use crate::error::{Error, IoContext, Result};
use crate::evidence::{Evidence, ImageRef};
pub use crate::protocol::Usage;
use crate::protocol::{self, Event, ProtocolError, Request, CONTROL_SOCKET};
use crate::runtime;
use crate::spec::SandboxSpec;

pub(crate) mod error;
pub use error::{OverlayProblem, SandboxError};

mod attach;
mod detached;
mod exec;
mod exit;
mod files;
mod launch;
mod relay;
mod stop;

pub(crate) use exec::Tail;
pub use exec::{ExecOutput, TtyExec};
pub use stop::{KillHandle, Stopping};

/// The file in the runtime dir holding the base environment of execs.
const BASE_ENV: &str = "env.json";
/// The file in the runtime dir holding [`ExecDefaults`].
const EXEC_DEFAULTS: &str = "exec-defaults.json";

/// What execs in a sandbox default to, from its image.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecDefaults {
    /// Working directory when none is given.
    pub cwd: Option<String>,
    /// User when none is given.
    pub user: Option<String>,
    /// Commands run through `/bin/sh` sourcing `/.singularity.d/env/*.sh`.
    pub source_env_scripts: bool,
}

/// How to start a sandbox.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Tie the sandbox to this process: it dies when this process dies.
    pub oneshot: bool,
    /// The sifbox binary that serves as supervisor.
    pub supervisor_exe: PathBuf,
    /// Fork the supervisor instead of executing `supervisor_exe` when this
    /// process is single-threaded (a CLI); faster, same behaviour.
    pub fork_when_possible: bool,
    /// Where sandbox.json goes (default: the runtime dir).
    pub evidence_dir: Option<PathBuf>,
    /// The image as the caller named it (default: the rootfs path).
    pub image: Option<ImageRef>,
    /// A sandbox a sifbox command makes for its own work (a build step):
    /// `sifbox ps` leaves it out unless asked for `--all`.
    pub hidden: bool,
    /// Lock files the supervisor holds shared for the sandbox's whole life
    /// (the image store's pin of its image: while held, the image is not
    /// removed under it). Each is locked as the lock-file protocol of
    /// `sifbox_sys::lockfile` says; one that is missing is skipped.
    pub holds: Vec<PathBuf>,
    /// A disk-backed writable layer made by the caller (the mount of a
    /// [`crate::disk::Reused`] layer), for a [`Writable::Disk`] sandbox:
    /// the supervisor uses it instead of making one.
    ///
    /// [`Writable::Disk`]: crate::spec::Writable::Disk
    pub disk_layer: Option<std::sync::Arc<OwnedFd>>,
}

impl StartOptions {
    /// Options for a sandbox started by the sifbox binary at `exe`.
    pub fn new(exe: PathBuf) -> StartOptions {
        StartOptions {
            oneshot: false,
            supervisor_exe: exe,
            fork_when_possible: true,
            evidence_dir: None,
            image: None,
            hidden: false,
            holds: Vec::new(),
            disk_layer: None,
        }
    }
}

/// The state of a sandbox's sandbox.json.
#[derive(Debug)]
enum Evidencing {
    /// Written once the sandbox is ready.
    Pending {
        path: PathBuf,
        spec: Box<SandboxSpec>,
        image: ImageRef,
    },
    Written(PathBuf),
    None,
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ExecStatus {
    /// The command ran and ended with this code (128+N for signal N; 124
    /// when it was killed at its timeout).
    Exited { code: i32, timed_out: bool },
    /// The command could not start: 125 (sifbox), 126 (not executable) or
    /// 127 (not found), with the reason.
    Failed { code: i32, message: String },
}

impl ExecStatus {
    /// The exit code under the contract of `sifbox run`.
    pub fn code(&self) -> i32 {
        match self {
            ExecStatus::Exited { code, .. } | ExecStatus::Failed { code, .. } => *code,
        }
    }

    /// Whether the exec was killed at its timeout.
    pub fn timed_out(&self) -> bool {
        matches!(
            self,
            ExecStatus::Exited {
                timed_out: true,
                ..
            }
        )
    }

    /// The final status an event carries, if it is one.
    pub(crate) fn from_event(ev: Event) -> Option<ExecStatus> {
        match ev {
            Event::Exit {
                code, timed_out, ..
            } => Some(ExecStatus::Exited { code, timed_out }),
            Event::Error { code, message } => Some(ExecStatus::Failed { code, message }),
            _ => None,
        }
    }
}

/// A running native sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// This client's shared hold on the sandbox's name (see
    /// [`crate::runtime`]), until the supervisor has its own (it takes it
    /// before it reports anything, so: until the first status line).
    reservation: RefCell<Option<File>>,
    /// The write end of the supervisor's control pipe: when it closes
    /// before a "detach" line, the client is gone and the sandbox ends.
    control: Option<File>,
    name: String,
    dir: PathBuf,
    /// Host pid of the outer supervisor, our child.
    supervisor: Option<Pid>,
    /// The supervisor's status pipe: read until "ready", then kept open so
    /// that its late status lines never hit a closed pipe.
    status: RefCell<Option<BufReader<File>>>,
    /// Whether "ready" was read from `status`.
    ready: Cell<bool>,
    /// The sandbox's clock when it became ready.
    ready_time_ns: Cell<u64>,
    /// Whether the outer supervisor is our child (else we attached by name).
    is_child: bool,
    /// Where sandbox.json goes, and what to write once ready.
    evidence: RefCell<Evidencing>,
    /// The sandbox's clock when its last exec ended.
    stop_inside_ns: Cell<u64>,
    /// The sandbox's last exec has run: it is stopping by itself.
    stopping: Cell<bool>,
    /// Init was asked to stop everything (and answered, or could not be
    /// reached).
    stop_asked: Cell<bool>,
    /// How its limits are enforced.
    limits: crate::limits::Enforcement,
    /// The calls the default seccomp policy denied: what this handle's
    /// execs reported, or the sandbox's totals from init's answer to stop.
    denied: RefCell<Vec<Denied>>,
}

/// A status line of the supervisor that is not an error.
enum Status {
    Unshared,
    /// With the sandbox's clock at that moment.
    Ready(u64),
}

/// Reads the supervisor's next status line; an error line or the end of the
/// pipe (the supervisor died) becomes the error.
fn read_status(status: &mut BufReader<File>, name: &str) -> Result<Status> {
    let mut line = String::new();
    status
        .read_line(&mut line)
        .ctx(|| format!("reading the status of sandbox {name}"))?;
    let line = line.trim_end();
    match line.split_once(' ').unwrap_or((line, "")) {
        ("unshared", _) => Ok(Status::Unshared),
        ("ready", t) => Ok(Status::Ready(t.parse().unwrap_or_default())),
        ("error", msg) => Err(Error::from_status(msg)),
        _ => Err(SandboxError::ExitedDuringSetup(name.to_string()).into()),
    }
}

impl Sandbox {
    /// Stores the environment that every exec starts from (0600: values
    /// may be secrets).
    pub fn set_base_env(&self, env: &[(String, String)]) -> Result<()> {
        let path = self.dir.join(BASE_ENV);
        let data = serde_json::to_vec(env)
            .map_err(|e| Error::io("encoding the environment", std::io::Error::other(e)))?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .ctx(|| format!("writing {}", path.display()))?;
        f.write_all(&data)
            .ctx(|| format!("writing {}", path.display()))
    }

    /// Stores what execs default to (from the image): working directory,
    /// user, and whether commands must source the image's env scripts.
    pub fn set_exec_defaults(&self, d: &ExecDefaults) -> Result<()> {
        let path = self.dir.join(EXEC_DEFAULTS);
        let data = serde_json::to_vec(d)
            .map_err(|e| Error::io("encoding exec defaults", std::io::Error::other(e)))?;
        std::fs::write(&path, data).ctx(|| format!("writing {}", path.display()))
    }

    /// What execs default to (nothing special when never set).
    pub fn exec_defaults(&self) -> Result<ExecDefaults> {
        let path = self.dir.join(EXEC_DEFAULTS);
        match std::fs::read(&path) {
            Ok(data) => serde_json::from_slice(&data).map_err(|e| Error::Protocol {
                name: self.name.clone(),
                why: format!("malformed {}: {e}", path.display()),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ExecDefaults::default()),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// The environment that every exec starts from.
    pub fn base_env(&self) -> Result<Vec<(String, String)>> {
        let path = self.dir.join(BASE_ENV);
        match std::fs::read(&path) {
            Ok(data) => serde_json::from_slice(&data).map_err(|e| Error::Protocol {
                name: self.name.clone(),
                why: format!("malformed {}: {e}", path.display()),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(crate::spec::clean_env(std::iter::empty(), &[]))
            }
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Adds an exec's denials to the handle's (for a pty exec, which its
    /// caller waits for: [`TtyExec::wait_reporting`]'s).
    pub fn note_denied(&self, denied: &[Denied]) {
        crate::denials::merge(&mut self.denied.borrow_mut(), denied);
    }

    /// The calls the default seccomp policy denied in the sandbox: once
    /// init answered a stop, every one (its count); before, those of this
    /// handle's execs.
    pub fn denied(&self) -> Vec<Denied> {
        self.denied.borrow().clone()
    }

    fn note_last(&self, last: bool, inside_ns: u64) {
        if last {
            self.stopping.set(true);
            self.stop_inside_ns.set(inside_ns);
        }
    }

    fn write_evidence(&self, inside_ready_ns: u64) -> Result<()> {
        let mut ev = self.evidence.borrow_mut();
        if let Evidencing::Pending { path, spec, image } = &*ev {
            let mut record = Evidence::new(spec, image.clone(), inside_ready_ns);
            record.limits = self.limits.clone();
            record.write(path)?;
            *ev = Evidencing::Written(path.clone());
        }
        Ok(())
    }

    /// Where this sandbox's sandbox.json is, once written (as records
    /// show it: a path in the runtime dir names that dir, not the
    /// descriptor this process reaches it through).
    pub fn evidence_path(&self) -> Option<PathBuf> {
        self.evidence_reached().map(|p| match runtime::root() {
            Ok(root) => root.shown(&p),
            Err(_) => p,
        })
    }

    /// [`Sandbox::evidence_path`] as this process reaches it.
    fn evidence_reached(&self) -> Option<PathBuf> {
        match &*self.evidence.borrow() {
            Evidencing::Written(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Lets the sandbox run on after this handle is gone (`sifbox start`).
    pub fn detach(mut self) {
        if let Some(mut c) = self.control.take() {
            // Not sent (the supervisor is gone): nothing is left to detach.
            let _ = c.write_all(b"detach\n");
        }
        self.reservation.replace(None);
        self.supervisor = None;
    }

    /// The sandbox's own clock when it became ready (0 when unknown).
    pub fn ready_time_ns(&self) -> u64 {
        self.ready_time_ns.get()
    }

    /// Host pid of the outer supervisor.
    pub fn supervisor_pid(&self) -> Option<i32> {
        self.supervisor.map(|p| p.as_raw_nonzero().get())
    }

    /// Whether the sandbox's supervisor still runs.
    pub fn is_running(&self) -> bool {
        self.supervisor
            .is_some_and(|p| runtime::process_start_time(p.as_raw_nonzero().get()).is_some())
    }

    /// Sends one request and waits for its `ok` (or error).
    fn request(&self, req: &Request, fds: &[BorrowedFd<'_>]) -> Result<u64> {
        let conn = self.connect()?;
        protocol::send(&conn, req, fds).map_err(|e| self.proto(e))?;
        self.reply(&conn)
    }

    /// Ends every process that the sandbox's commands started, but those
    /// of detached execs (see [`Request::EndProcesses`]); returns how
    /// many were ended.
    pub fn end_processes(&self) -> Result<u32> {
        let conn = self.connect()?;
        protocol::send(&conn, &Request::EndProcesses, &[]).map_err(|e| self.proto(e))?;
        match protocol::recv::<Event>(&conn) {
            Ok((Event::Ended { processes }, _)) => Ok(processes),
            got => Err(self.not_wanted(got.map(|(ev, _)| ev))),
        }
    }

    fn reply(&self, conn: &UnixStream) -> Result<u64> {
        match protocol::recv::<Event>(conn) {
            Ok((Event::Ok { time_ns, .. }, _)) => Ok(time_ns),
            got => Err(self.not_wanted(got.map(|(ev, _)| ev))),
        }
    }

    /// The error a reply other than the one waited for makes: the
    /// server's refusal, or a protocol failure.
    fn not_wanted(&self, got: std::result::Result<Event, ProtocolError>) -> Error {
        match got {
            Ok(Event::Error { message, .. }) => SandboxError::Refused {
                name: self.name.clone(),
                message,
            }
            .into(),
            Ok(other) => self.unexpected(&other),
            Err(e) => self.proto(e),
        }
    }

    /// The protocol failure an event out of turn makes.
    fn unexpected(&self, ev: &Event) -> Error {
        self.proto(ProtocolError::Io(std::io::Error::other(format!(
            "unexpected {ev:?}"
        ))))
    }

    /// How the sandbox's limits are enforced on this host, and which it
    /// asked for that cannot be.
    pub fn limits(&self) -> &crate::limits::Enforcement {
        &self.limits
    }

    /// What the sandbox used so far (see [`Usage`]).
    pub fn usage(&self) -> Usage {
        let cg = self.limits.cgroup.as_ref();
        let watched = self.watchdog_usage();
        Usage {
            cpu_ns: cg
                .and_then(crate::limits::cgroup::SandboxCgroup::cpu_usage_ns)
                .or_else(|| self.tree_cpu_ns()),
            memory_peak: cg
                .and_then(crate::limits::cgroup::SandboxCgroup::memory_peak)
                .or(watched.memory_peak),
            oom_kills: cg
                .and_then(crate::limits::cgroup::SandboxCgroup::oom_kills)
                .unwrap_or(0)
                .max(watched.oom_kills),
            peak_resets: watched.peak_resets,
        }
    }

    /// Starts a new memory peak for [`Sandbox::usage`] (a phase's own);
    /// returns once it has (the watchdog's within half a second).
    pub fn reset_memory_peak(&self) {
        if let Some(cg) = &self.limits.cgroup {
            let _ = cg.reset_memory_peak();
        }
        if self.limits.watchdog_memory.is_some() {
            if let Some(pid) = self.supervisor {
                // outer's watchdog starts a new peak on SIGUSR1 and counts
                // it in usage.json.
                let before = self.watchdog_usage().peak_resets;
                if rustix::process::kill_process(pid, Signal::USR1).is_ok() {
                    let deadline =
                        std::time::Instant::now() + std::time::Duration::from_millis(500);
                    while self.watchdog_usage().peak_resets <= before
                        && std::time::Instant::now() < deadline
                    {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                }
            }
        }
    }

    /// The watchdog's record (`usage.json` in the runtime dir), if any.
    fn watchdog_usage(&self) -> Usage {
        std::fs::read(self.dir.join(crate::limits::USAGE_FILE))
            .ok()
            .and_then(|d| serde_json::from_slice(&d).ok())
            .unwrap_or_default()
    }

    /// CPU time of the sandbox's processes (init and below), from /proc.
    fn tree_cpu_ns(&self) -> Option<u64> {
        let outer = self.supervisor?.as_raw_nonzero().get();
        let init = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
            .ok()?
            .split_ascii_whitespace()
            .next()?
            .parse::<i32>()
            .ok()?;
        let ticks = crate::limits::tree_cpu_ticks(Path::new("/proc"), init);
        let hz = rustix::param::clock_ticks_per_second();
        Some(ticks.saturating_mul(1_000_000_000) / hz.max(1))
    }

    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sandbox's runtime dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn connect(&self) -> Result<UnixStream> {
        connect(&self.dir).map_err(|e| {
            // A sandbox still setting up whose supervisor gave up has closed
            // the socket: its own reason is on the status pipe.
            if let Err(setup) = self.wait_ready() {
                return setup;
            }
            Error::Protocol {
                name: self.name.clone(),
                why: format!("cannot reach its control socket: {e}"),
            }
        })
    }

    fn proto(&self, e: ProtocolError) -> Error {
        // A sandbox still setting up whose supervisor gave up after we
        // connected (its listener was there, the request met a closed
        // peer: EPIPE, EOF): its own reason is on the status pipe.
        if !self.ready.get() && self.status.borrow().is_some() {
            if let Err(setup) = self.wait_ready() {
                return setup;
            }
        }
        Error::Protocol {
            name: self.name.clone(),
            why: e.to_string(),
        }
    }
}

/// A sandbox this handle started is stopped when the handle goes (unless
/// detached); one it attached to by name runs on.
impl Drop for Sandbox {
    fn drop(&mut self) {
        if !self.is_child {
            return;
        }
        if let Err(e) = self.shutdown(std::time::Duration::ZERO) {
            tracing::warn!("cleaning up sandbox {}: {e}", self.name);
        }
    }
}

/// Connects to the control socket of the sandbox whose runtime dir is `dir`
/// (through /proc/self/fd when the path is too long for a socket address).
pub fn connect(dir: &Path) -> std::io::Result<UnixStream> {
    // A socket address holds 108 bytes; a longer path goes through an fd of
    // the dir (one more open and a lookup through /proc).
    let direct = dir.join(CONTROL_SOCKET);
    if direct.as_os_str().len() < 100 {
        return UnixStream::connect(direct);
    }
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    use std::os::fd::AsRawFd;
    UnixStream::connect(format!(
        "/proc/self/fd/{}/{CONTROL_SOCKET}",
        fd.as_fd().as_raw_fd()
    ))
}
