//! The sandbox supervisor: `sifbox __supervisor`, re-executed from the sifbox
//! binary so that it is single-threaded and may fork freely.
//!
//! Process tree of one sandbox:
//!
//! ```text
//! client (sifbox run/start)
//!  └─ outer   host pid ns; new user ns. Maps init's nested user ns when asked,
//!      │      waits for init, then removes the runtime dir.
//!      └─ init    PID 1 of the sandbox: new mount/ipc/uts(/net) ns; assembles the
//!          │      root and pivots, then moves into a nested user ns (which has no
//!          │      capability over that mount ns, so nothing inside can undo a
//!          │      mount such as the read-only cover of /proc/sys) and serves
//!          │      control connections; reaps orphans. When it exits, the kernel
//!          │      kills every process of the sandbox.
//!          └─ exec    one per command: a child subreaper that spawns the command
//!              └─ CMD  with the client's stdio (SCM_RIGHTS) or a pty.
//! ```
//!
//! A sandbox's last command (`stop_after`, as in a one-shot `run`) runs under
//! init directly, which then stops the sandbox without another round trip.
//!
//! The client talks to outer over two pipes: outer's stdin carries the launch
//! description (and "mapped" once the client wrote external id maps), outer's
//! stdout carries status lines: `unshared`, `ready`, `error MESSAGE`,
//! `exited CODE`. Every parent-to-child link carries a parent-death signal, so
//! a SIGKILLed client (one-shot) or outer takes the whole sandbox down.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sifbox_sys::syscall::Kernel;

use crate::error::{Error, Result};
use crate::protocol;
use crate::spec::SandboxSpec;

/// The hidden first argument that turns the sifbox binary into a supervisor.
mod handoff;
mod init;
mod outer;
mod pool;
mod serve;
mod watchdog;

use outer::outer;

pub(crate) mod error;
pub use error::{InitError, OuterError, SupervisorError};

pub const SUPERVISOR_ARG: &str = "__supervisor";

/// The second word of a running supervisor's title in the host's `ps`:
/// `sifbox sandbox NAME` (outer and init alike; commands are their own).
pub const TITLE: &str = "sandbox";

/// The id of the calling thread.
pub fn current_tid() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// Asks every sandbox supervisor that thread `tid` of this process started
/// to kill its sandbox (SIGTERM to a supervisor does that); returns how
/// many there were. Other children are left alone. A job or a build that
/// is stopped (Ctrl-C, a timeout) does this from another thread: the
/// thread's pending exec then fails, and its error path removes what it
/// made.
pub fn kill_sandboxes_of_thread(tid: i32) -> usize {
    let path = format!("/proc/self/task/{tid}/children");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return 0;
    };
    let mut n = 0;
    for pid in text
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        let supervisor =
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| is_supervisor_cmdline(&c));
        if !supervisor {
            continue;
        }
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            if rustix::process::kill_process(p, rustix::process::Signal::TERM).is_ok() {
                n += 1;
            }
        }
    }
    n
}

/// Whether the command line `cmdline` (NUL-separated, from
/// /proc/PID/cmdline) is a sandbox supervisor's: still `sifbox
/// __supervisor` while it starts, `sifbox sandbox NAME` once it runs.
pub fn is_supervisor_cmdline(cmdline: &[u8]) -> bool {
    let mut words = cmdline.split(|b| *b == 0);
    words.next() == Some(b"sifbox".as_slice())
        && words
            .next()
            .is_some_and(|w| w == SUPERVISOR_ARG.as_bytes() || w == TITLE.as_bytes())
}

/// Where a sandbox that outlives its client writes its diagnostics.
pub const SUPERVISOR_LOG: &str = "supervisor.log";

/// What the client hands the supervisor on its stdin (one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Launch {
    pub spec: SandboxSpec,
    /// The sandbox's runtime dir.
    pub dir: PathBuf,
    /// Tie the sandbox's life to the client's (a one-shot `run`).
    pub oneshot: bool,
    /// The client's pid, to detect a client that died before we started.
    pub client_pid: i32,
    /// How the sandbox's limits are enforced (its cgroup, made by the
    /// client; the rlimit, affinity and watchdog to apply here).
    #[serde(default)]
    pub limits: crate::limits::Enforcement,
    /// Device and inode of the lock of the sandbox's runtime dir, which the
    /// client made and holds: outer takes its own hold on that file.
    #[serde(default)]
    pub lock_id: Option<(u64, u64)>,
    /// Lock files outer holds shared while it lives (`StartOptions::holds`).
    #[serde(default)]
    pub holds: Vec<PathBuf>,
    /// The disk-backed layer comes with the launch (`StartOptions::disk_layer`)
    /// rather than being made by outer.
    #[serde(default)]
    pub disk_given: bool,
}

/// Status lines to the client.
struct Status(Option<File>);

impl Status {
    fn send(&mut self, line: &str) {
        // The client may be gone (it then no longer cares); a failed write
        // is not an error of the sandbox.
        if let Some(f) = &mut self.0 {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }

    /// Closes this process's copy of the status pipe.
    fn close(&mut self) {
        self.0 = None;
    }

    fn error(&mut self, e: &Error) {
        self.send(&format!("error {}", e.status_line()));
    }
}

fn errno(what: &str) -> impl FnOnce(rustix::io::Errno) -> Error + '_ {
    move |e| Error::syscall(what, e)
}

/// Entry point of `sifbox __supervisor`; returns the exit code.
pub fn main() -> i32 {
    // fd 1 is the status pipe; keep it as a close-on-exec fd and point fd 1
    // at /dev/null so no command inherits it.
    let mut status = match take_fd(1) {
        Ok(fd) => Status(Some(File::from(fd))),
        Err(_) => return 125,
    };
    // fd 0 is the control pipe: kept the same way, watched by outer for
    // the client's going away.
    let control = match take_fd(0) {
        Ok(fd) => File::from(fd),
        Err(e) => {
            status.error(&Error::io("the control pipe", e));
            return 125;
        }
    };
    // Whatever else the client's caller left open must not reach the
    // sandbox: only the status and control pipes stay.
    let mut kept = vec![std::os::fd::AsFd::as_fd(&control)];
    kept.extend(status.0.as_ref().map(std::os::fd::AsFd::as_fd));
    let closed = sifbox_sys::close_inherited_fds(&kept);
    drop(kept);
    if let Err(e) = closed {
        status.error(&e.into());
        return 125;
    }
    // The launch, and the disk-backed layer when the client made it.
    let control = UnixStream::from(OwnedFd::from(control));
    let launch =
        protocol::recv::<Launch>(&control).map_err(|e| Error::from(SupervisorError::Launch(e)));
    let mut input = BufReader::new(File::from(OwnedFd::from(control)));
    let launch = launch.and_then(|(mut l, mut fds)| {
        // The runtime dir comes first, as a descriptor: reached through it
        // (kept open for the supervisor's life), never by a path again.
        if fds.is_empty() {
            return Err(SupervisorError::NoRuntimeDir.into());
        }
        let dir = fds.remove(0);
        l.dir = sifbox_sys::fd_path(std::os::fd::AsFd::as_fd(&dir));
        let disk = given_disk(&l, &mut fds)?;
        Ok((l, disk, dir))
    });
    let launch = launch.and_then(|(l, disk, dir)| {
        sifbox_sys::scrub_proc_identity(&["sifbox", TITLE, &l.spec.name])?;
        Ok((l, disk, dir))
    });
    // As a forked one does: a sandbox that outlives its client logs to its
    // runtime dir, not to the client's stderr (which would stay open).
    let launch = launch.and_then(|(l, disk, dir)| {
        if !l.oneshot {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(l.dir.join(SUPERVISOR_LOG))
                .map_err(|e| Error::io("opening the supervisor log", e))?;
            rustix::stdio::dup2_stderr(&log).map_err(errno("dup2"))?;
        }
        Ok((l, disk, dir))
    });
    finish(
        launch.and_then(|(l, disk, dir)| {
            outer(&Kernel, &l, &mut input, &mut status, None, disk, dir)
        }),
        &mut status,
    )
}

/// The disk-backed layer that came with the launch: one when the launch
/// says so, else none.
fn given_disk(launch: &Launch, fds: &mut Vec<OwnedFd>) -> Result<Option<OwnedFd>> {
    match (launch.disk_given, fds.len()) {
        (false, 0) => Ok(None),
        (true, 1) => Ok(fds.pop()),
        (disk_given, count) => Err(SupervisorError::Descriptors { count, disk_given }.into()),
    }
}

/// Entry point of a supervisor forked (not executed) by a single-threaded
/// client: same protocol, over the given pipes.
pub fn main_forked(
    launch: &Launch,
    dir: OwnedFd,
    control: OwnedFd,
    status: OwnedFd,
    listener: UnixListener,
    disk: Option<OwnedFd>,
) -> i32 {
    use std::os::fd::AsFd;
    let mut status = Status(Some(File::from(status)));
    // Carry neither the client's argv nor its environment, none of the
    // descriptors it had open but those it handed over (`dir`, which
    // `launch.dir` names, kept by outer for its life), and none of
    // its stdio but stderr (init drops that too); a sandbox that outlives
    // its client logs to its runtime dir instead.
    let keep = [
        dir.as_fd(),
        control.as_fd(),
        listener.as_fd(),
        status.0.as_ref().map_or(control.as_fd(), AsFd::as_fd),
        disk.as_ref().map_or(control.as_fd(), AsFd::as_fd),
    ];
    let prepared = sifbox_sys::scrub_proc_identity(&["sifbox", TITLE, &launch.spec.name])
        .and_then(|()| sifbox_sys::close_inherited_fds(&keep))
        .map_err(Error::from)
        .and_then(|()| {
            let null = rustix::fs::open(
                "/dev/null",
                rustix::fs::OFlags::RDWR,
                rustix::fs::Mode::empty(),
            )
            .map_err(errno("opening /dev/null"))?;
            rustix::stdio::dup2_stdin(&null).map_err(errno("dup2"))?;
            rustix::stdio::dup2_stdout(&null).map_err(errno("dup2"))?;
            if !launch.oneshot {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(launch.dir.join(SUPERVISOR_LOG))
                    .map_err(|e| Error::io("opening the supervisor log", e))?;
                rustix::stdio::dup2_stderr(&log).map_err(errno("dup2"))?;
            }
            Ok(())
        });
    let mut input = BufReader::new(File::from(control));
    finish(
        prepared.and_then(|()| {
            outer(
                &Kernel,
                launch,
                &mut input,
                &mut status,
                Some(listener),
                disk,
                dir,
            )
        }),
        &mut status,
    )
}

fn finish(result: Result<i32>, status: &mut Status) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            status.error(&e);
            125
        }
    }
}

/// Duplicates `fd` close-on-exec and replaces it with /dev/null.
fn take_fd(fd: i32) -> std::io::Result<OwnedFd> {
    let borrowed = match fd {
        0 => rustix::stdio::stdin(),
        _ => rustix::stdio::stdout(),
    };
    let dup = rustix::io::fcntl_dupfd_cloexec(borrowed, 3)?;
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR,
        rustix::fs::Mode::empty(),
    )?;
    match fd {
        0 => rustix::stdio::dup2_stdin(&null)?,
        _ => rustix::stdio::dup2_stdout(&null)?,
    }
    Ok(dup)
}

fn read_line(input: &mut impl BufRead) -> Result<String> {
    let mut line = String::new();
    input
        .read_line(&mut line)
        .map_err(|e| Error::io("reading from the client", e))?;
    if line.is_empty() {
        return Err(SupervisorError::ClientGone.into());
    }
    Ok(line.trim_end().to_string())
}

/// Ends a forked process without returning into the caller's stack.
#[allow(clippy::exit, reason = "a forked supervisor process ends here")]
fn exit_now(code: i32) -> ! {
    std::process::exit(code)
}
