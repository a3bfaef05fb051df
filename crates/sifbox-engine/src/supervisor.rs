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

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};
use rustix::thread::UnshareFlags;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::idmap;
use crate::protocol::{self, Event, ExecRequest, Request};
use crate::rootfs;
use crate::spec::{Confinement, NetMode, SandboxSpec};
use crate::{transfer, worker};

/// The hidden first argument that turns the sifbox binary into a supervisor.
pub const SUPERVISOR_ARG: &str = "__supervisor";

/// Where a sandbox that outlives its client writes its diagnostics.
pub const SUPERVISOR_LOG: &str = "supervisor.log";

/// Name of the control socket in the sandbox's runtime dir.
pub const CONTROL_SOCKET: &str = "control.sock";

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
        let one_line = e.to_string().replace('\n', " ");
        self.send(&format!("error {one_line}"));
    }
}

fn errno(what: &str) -> impl FnOnce(rustix::io::Errno) -> Error + '_ {
    move |e| Error::Setup(format!("{what}: {}", std::io::Error::from(e)))
}

/// Entry point of `sifbox __supervisor`; returns the exit code.
pub fn main() -> i32 {
    // fd 1 is the status pipe; keep it as a close-on-exec fd and point fd 1
    // at /dev/null so no command inherits it.
    let mut status = match take_fd(1) {
        Ok(fd) => Status(Some(File::from(fd))),
        Err(_) => return 125,
    };
    // Whatever else the client's caller left open must not reach the
    // sandbox: only the status pipe stays (fd 0 is the control pipe).
    let kept = status.0.as_ref().map(std::os::fd::AsFd::as_fd);
    let closed = sifbox_sys::close_inherited_fds(kept.as_slice());
    if let Err(e) = closed {
        status.error(&e.into());
        return 125;
    }
    let mut input = BufReader::new(std::io::stdin().lock());
    let launch = read_line(&mut input).and_then(|l| {
        serde_json::from_str::<Launch>(&l)
            .map_err(|e| Error::Setup(format!("malformed launch description: {e}")))
    });
    finish(
        launch.and_then(|l| outer(&l, &mut input, &mut status, None)),
        &mut status,
    )
}

/// Entry point of a supervisor forked (not executed) by a single-threaded
/// client: same protocol, over the given pipes.
pub fn main_forked(
    launch: &Launch,
    control: OwnedFd,
    status: OwnedFd,
    listener: UnixListener,
) -> i32 {
    use std::os::fd::AsFd;
    let mut status = Status(Some(File::from(status)));
    // Carry neither the client's argv nor its environment, none of the
    // descriptors it had open but the three it handed over, and none of
    // its stdio but stderr (init drops that too); a sandbox that outlives
    // its client logs to its runtime dir instead.
    let keep = [
        control.as_fd(),
        listener.as_fd(),
        status.0.as_ref().map_or(control.as_fd(), AsFd::as_fd),
    ];
    let prepared = sifbox_sys::scrub_proc_identity(&["sifbox", SUPERVISOR_ARG])
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
        prepared.and_then(|()| outer(launch, &mut input, &mut status, Some(listener))),
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
        return Err(Error::Setup("the client went away during setup".into()));
    }
    Ok(line.trim_end().to_string())
}

/// `listener`: the control socket when the client made it; else init makes it.
fn outer(
    launch: &Launch,
    input: &mut impl BufRead,
    status: &mut Status,
    listener: Option<UnixListener>,
) -> Result<i32> {
    if launch.oneshot {
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
            .map_err(errno("prctl(PR_SET_PDEATHSIG)"))?;
        if rustix::process::getppid()
            .map(Pid::as_raw_nonzero)
            .map(|p| p.get())
            != Some(launch.client_pid)
        {
            return Ok(125);
        }
    }
    // Out of the client's session: terminal signals go to the client, which
    // then stops the sandbox.
    let _ = rustix::process::setsid();
    // A disk-backed writable layer while we are in the host's namespaces
    // (its loop device and ext4 mount need host root), outside the
    // sandbox's limits (mkfs is ours, not the sandbox's).
    let disk = match &launch.spec.writable {
        crate::spec::Writable::Disk { size_mib, scratch } => {
            let mkfs = crate::disk::mkfs_path().ok_or_else(|| {
                Error::Setup("the disk-backed layer: mkfs.ext4 is not installed".into())
            })?;
            let owner = (
                launch.spec.ids.uid[0].outside,
                launch.spec.ids.gid[0].outside,
            );
            Some(crate::disk::make(*size_mib, scratch, owner, &mkfs)?)
        }
        _ => None,
    };
    // Limits first, so that everything forked from here on is under them.
    enter_limits(&launch.limits)?;

    sifbox_sys::unshare_namespaces(UnshareFlags::NEWUSER | UnshareFlags::NEWPID).map_err(|e| Error::Host {
        what: "creating the sandbox's user and pid namespaces".into(),
        source: e,
        fix: "unprivileged user namespaces may be disabled or exhausted on this host; run `sifbox doctor`".into(),
    })?;
    let ids = &launch.spec.ids;
    if ids.external {
        status.send("unshared");
        let answer = read_line(input)?;
        if answer != "mapped" {
            return Ok(125);
        }
    } else {
        let (uid, gid) = (ids.uid[0].outside, ids.gid[0].outside);
        idmap::write_file(Path::new("/proc/self/setgroups"), "deny\n")?;
        idmap::write_file(Path::new("/proc/self/uid_map"), &format!("0 {uid} 1\n"))?;
        idmap::write_file(Path::new("/proc/self/gid_map"), &format!("0 {gid} 1\n"))?;
    }

    // init asks us (over `nest`) to map the nested user namespace it moves
    // into once its mounts are made; only a process outside it may. The
    // request carries what the memory watchdog measures tmpfs use on.
    let (nest_outer, nest_init) =
        UnixStream::pair().map_err(|e| Error::io("socketpair for init", e))?;
    // With a watchdog, init says over this pipe when the sandbox goes idle
    // and when work starts again (see [`Activity`]).
    let (activity_outer, activity_init) = match launch.limits.watchdog_memory {
        Some(_) => {
            let (r, w) = rustix::pipe::pipe_with(
                rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
            )
            .map_err(errno("pipe"))?;
            (Some(r), Some(w))
        }
        None => (None, None),
    };
    let init = match sifbox_sys::fork()? {
        sifbox_sys::Forked::Child => {
            drop((nest_outer, activity_outer));
            let nest = Nest(nest_init);
            let code = match init_main(launch, status, nest, listener, disk, activity_init) {
                Ok(()) => 0,
                Err(e) => {
                    status.error(&e);
                    125
                }
            };
            exit_now(code)
        }
        sifbox_sys::Forked::Parent(pid) => pid,
    };
    // init holds the disk-backed layer now: it goes with init's mounts.
    drop((nest_init, listener, disk, activity_init));
    sifbox_sys::release_free_memory();
    let waited = wait_init(init, launch, nest_outer, activity_outer);
    if let Some(cg) = &launch.limits.cgroup {
        // Out of the cgroup, which goes with the sandbox.
        if let Err(e) = cg.remove(std::process::id()) {
            tracing::warn!("removing the sandbox's cgroup: {e}");
        }
    }
    let oom_kills = waited?;
    // The client reads why a sandbox went after its runtime dir is gone.
    status.send(&format!("exited 0 oom_kills={oom_kills}"));
    crate::runtime::remove_dir(&launch.dir)?;
    Ok(0)
}

/// Joins the sandbox's cgroup and takes its CPU affinity (outer does, before
/// it forks anything).
fn enter_limits(limits: &crate::limits::Enforcement) -> Result<()> {
    if let Some(cg) = &limits.cgroup {
        cg.join(std::process::id()).map_err(|e| Error::Host {
            what: "joining the sandbox's cgroup".into(),
            source: e,
            fix: "run `sifbox doctor` to see what this host allows".into(),
        })?;
    }
    if let Some(cpus) = &limits.affinity {
        let mut set = rustix::thread::CpuSet::new();
        for &c in cpus {
            set.set(c);
        }
        rustix::thread::sched_setaffinity(None, &set).map_err(errno("sched_setaffinity"))?;
    }
    Ok(())
}

/// Ends a forked process without returning into the caller's stack.
#[allow(clippy::exit, reason = "a forked supervisor process ends here")]
fn exit_now(code: i32) -> ! {
    std::process::exit(code)
}

/// init's side of the nested-namespace handshake: a request (with the fds
/// of its tmpfs mounts for the watchdog), then outer's "mapped".
struct Nest(UnixStream);

/// Waits for init, and maps its nested user namespace when it asks;
/// SIGTERM/SIGINT/SIGHUP to outer stop the sandbox at once. With a memory
/// limit and no cgroup, this is also the watchdog (see [`Watchdog`]).
fn wait_init(
    init: Pid,
    launch: &Launch,
    nest: UnixStream,
    activity: Option<OwnedFd>,
) -> Result<u64> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let spec = &launch.spec;
    let pipe = || {
        rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .map_err(errno("pipe"))
    };
    let (sig_r, sig_w) = pipe()?;
    let sig_w = File::from(sig_w);
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ] {
        let w = sig_w.try_clone().map_err(|e| Error::io("signal pipe", e))?;
        signal_hook::low_level::pipe::register(sig, w)
            .map_err(|e| Error::io("installing signal handlers", e))?;
    }
    let pidfd = rustix::process::pidfd_open(init, rustix::process::PidfdFlags::empty())
        .map_err(errno("pidfd_open"))?;
    let mut watchdog = match launch.limits.watchdog_memory {
        Some(limit) => {
            let (reset_r, reset_w) = pipe()?;
            signal_hook::low_level::pipe::register(
                signal_hook::consts::SIGUSR1,
                File::from(reset_w),
            )
            .map_err(|e| Error::io("installing signal handlers", e))?;
            Some(Watchdog::new(
                limit,
                init,
                launch.dir.clone(),
                reset_r,
                activity,
            ))
        }
        None => None,
    };
    let mut nest = Some(nest);
    loop {
        let mut fds = vec![
            PollFd::new(&pidfd, PollFlags::IN),
            PollFd::new(&sig_r, PollFlags::IN),
        ];
        let nest_at = fds.len();
        if let Some(n) = &nest {
            fds.push(PollFd::new(n, PollFlags::IN));
        }
        // An armed watchdog also wakes for a new peak and for init's word
        // that the sandbox went idle or busy.
        let watch_at = fds.len();
        if let Some(w) = watchdog.as_ref().filter(|w| w.armed()) {
            fds.push(PollFd::new(&w.reset, PollFlags::IN));
            if let Some(a) = &w.activity {
                fds.push(PollFd::new(a, PollFlags::IN));
            }
        }
        let timeout = watchdog.as_ref().filter(|w| w.armed() && !w.idle).map(|w| {
            let ms = w.next_ms;
            Timespec {
                tv_sec: i64::try_from(ms / 1000).unwrap_or(1),
                tv_nsec: i64::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
            }
        });
        let ready = match poll(&mut fds, timeout.as_ref()) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(errno("poll")(e)),
        };
        let (init_done, signalled) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        let nest_ready = nest.is_some() && !fds[nest_at].revents().is_empty();
        let activity_ready = fds
            .get(watch_at + 1)
            .is_some_and(|f| !f.revents().is_empty());
        drop(fds);
        if signalled {
            // Once is enough: init's exit is what we wait for next.
            let _ = rustix::process::kill_process(init, Signal::KILL);
            break;
        }
        if nest_ready {
            if let Some(n) = nest.take() {
                if let Ok((_, mut fds)) = protocol::recv::<String>(&n) {
                    if let Some(w) = &mut watchdog {
                        // The sandbox's /proc first, then its tmpfs mounts.
                        if !fds.is_empty() {
                            w.proc = rustix::fs::Dir::read_from(fds.remove(0)).ok();
                        }
                        w.tmpfs = fds;
                    }
                    let proc = PathBuf::from(format!("/proc/{}", init.as_raw_nonzero()));
                    let mapped = idmap::write_file(
                        &proc.join("uid_map"),
                        &idmap::map_text(&idmap::identity_of(&spec.ids.uid)),
                    )
                    .and_then(|()| {
                        idmap::write_file(
                            &proc.join("gid_map"),
                            &idmap::map_text(&idmap::identity_of(&spec.ids.gid)),
                        )
                    });
                    if mapped.is_ok() {
                        let _ = protocol::send(&n, &"mapped", &[]);
                    }
                    // On failure init reads EOF and reports it.
                }
                // Every map is written (not before: init is forked from
                // us, and a non-dumpable parent would make its children's
                // /proc files, its uid_map too, host root's): from now on
                // only our own code reads our memory and descriptors.
                let _ = rustix::process::set_dumpable_behavior(
                    rustix::process::DumpableBehavior::NotDumpable,
                );
                // All that is left to do is wait (and watch): the pages of
                // setting up need not stay mapped.
                sifbox_sys::drop_clean_file_pages();
                if let Some(w) = &mut watchdog {
                    w.arm();
                }
            }
        }
        if init_done {
            break;
        }
        if let Some(w) = &mut watchdog {
            let woke = activity_ready && w.activity_changed();
            if w.reset_asked() {
                w.sample();
                w.record();
            } else if ready == 0 || woke {
                w.sample();
            }
            if woke && !w.idle {
                w.next_ms = 20;
            }
        }
    }
    if let Some(w) = &watchdog {
        w.record();
    }
    loop {
        match rustix::process::waitpid(Some(init), WaitOptions::empty()) {
            Err(rustix::io::Errno::INTR) => continue,
            _ => return Ok(watchdog.map_or(0, |w| w.oom_kills)),
        }
    }
}

/// The memory watchdog of a sandbox without a memory cgroup: outer samples
/// what the sandbox's processes hold alone (their private resident pages)
/// plus what its tmpfs mounts hold, faster as the headroom shrinks, and
/// kills the largest process when the sum passes the limit, as the OOM
/// killer would; `usage.json` in the runtime dir records the peak and the
/// kills. SIGUSR1 starts a new peak.
struct Watchdog {
    limit: u64,
    init: Pid,
    dir: PathBuf,
    /// The sandbox's /proc, from init.
    proc: Option<rustix::fs::Dir>,
    /// The roots of the writable layer's tmpfs (the overlay's statfs is its
    /// upper layer's) and /dev/shm, from init.
    tmpfs: Vec<OwnedFd>,
    reset: OwnedFd,
    /// init's word on the sandbox going idle or busy (see [`Activity`]).
    activity: Option<OwnedFd>,
    /// The sandbox is idle: no sampling until init says it is busy.
    idle: bool,
    next_ms: u64,
    armed: bool,
    peak: u64,
    recorded_peak: u64,
    /// The last sample's total.
    last_used: u64,
    oom_kills: u64,
    /// Peaks started on request (the client waits for the count to move).
    resets: u64,
}

impl Watchdog {
    fn new(
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
    fn arm(&mut self) {
        self.armed = true;
        self.sample();
    }

    fn armed(&self) -> bool {
        self.armed
    }

    /// Reads what init said; whether the sandbox went from idle to busy or
    /// back (the last word counts). EOF (init is gone) means busy.
    fn activity_changed(&mut self) -> bool {
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
    fn reset_asked(&mut self) -> bool {
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

    fn sample(&mut self) {
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
    fn record(&self) {
        let usage = crate::sandbox::Usage {
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

/// PID 1 of the sandbox.
fn init_main(
    launch: &Launch,
    status: &mut Status,
    nest: Nest,
    listener: Option<UnixListener>,
    disk: Option<OwnedFd>,
    activity: Option<OwnedFd>,
) -> Result<()> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(errno("prctl(PR_SET_PDEATHSIG)"))?;
    let spec = &launch.spec;
    // Nothing of the client's stdin or stdout (the control pipe, when the
    // supervisor was executed) stays in the sandbox; stderr goes before
    // the first request is served.
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(errno("opening /dev/null"))?;
    rustix::stdio::dup2_stdin(&null).map_err(errno("dup2"))?;
    rustix::stdio::dup2_stdout(&null).map_err(errno("dup2"))?;
    // A session keyring of the sandbox's own: the caller's (an ssh login's
    // keys) is out of reach even of commands that may call keyctl.
    join_keyring(spec)?;
    let mut flags = UnshareFlags::NEWNS | UnshareFlags::NEWIPC | UnshareFlags::NEWUTS;
    if spec.net == NetMode::None {
        flags |= UnshareFlags::NEWNET;
    }
    sifbox_sys::unshare_namespaces(flags).map_err(|e| Error::Host {
        what: "creating the sandbox's mount, ipc, uts and network namespaces".into(),
        source: e,
        fix: "run `sifbox doctor` to see what this host allows".into(),
    })?;
    // Host supplementary groups do not follow into the sandbox where the
    // kernel lets us drop them (not in single-id namespaces).
    let _ = rustix::thread::set_thread_groups(&[]);
    let root = rootfs::assemble(spec, &launch.dir, disk)?;
    if spec.net == NetMode::None {
        sifbox_sys::loopback_up()?;
    }
    rustix::system::sethostname(spec.hostname.as_bytes()).map_err(errno("sethostname"))?;
    let listener = match listener {
        Some(l) => l,
        None => {
            // A relative name: runtime dir paths can be longer than a socket
            // address allows.
            rustix::process::chdir(&launch.dir).map_err(errno("chdir to the runtime dir"))?;
            UnixListener::bind(CONTROL_SOCKET).map_err(|e| {
                Error::io(
                    format!("creating {}/{CONTROL_SOCKET}", launch.dir.display()),
                    e,
                )
            })?
        }
    };
    rootfs::pivot(&root)?;
    // Its fds (the overlay's, /proc's, /dev's) are of no further use.
    drop(root);

    // Move into a nested user namespace, which holds no capability over the
    // mount namespace made above: nothing inside can undo a mount (say, the
    // read-only cover of /proc/sys), and a mount namespace made inside gets
    // these mounts locked. outer writes its maps.
    // The process cap without a cgroup: the kernel caps the processes of
    // a user namespace (all the sandbox's, whatever their ids) at the
    // RLIMIT_NPROC its creator had when it made it.
    if let Some(n) = launch.limits.nproc {
        let l = rustix::process::Rlimit {
            current: Some(n),
            maximum: Some(n),
        };
        rustix::process::setrlimit(rustix::process::Resource::Nproc, l)
            .map_err(errno("setrlimit(RLIMIT_NPROC)"))?;
    }
    sifbox_sys::unshare_namespaces(UnshareFlags::NEWUSER)
        .map_err(|e| Error::io("creating the nested user namespace", e))?;
    // What the watchdog measures: the root (whose statfs is the writable
    // layer's tmpfs) and /dev/shm.
    let mut tmpfs = Vec::new();
    let mut activity = activity.map(|pipe| (pipe, None));
    if launch.limits.watchdog_memory.is_some() {
        // The watchdog lists the sandbox's processes in its /proc; so does
        // init, to tell it when the sandbox is idle.
        match rustix::fs::open(
            "/proc",
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => {
                if let Some((_, proc)) = &mut activity {
                    *proc = rustix::io::fcntl_dupfd_cloexec(&fd, 3)
                        .ok()
                        .and_then(|d| rustix::fs::Dir::read_from(d).ok());
                }
                tmpfs.push(fd);
            }
            Err(e) => return Err(errno("opening /proc for the memory watchdog")(e)),
        }
        let open = |p: &str| {
            rustix::fs::open(
                p,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
        };
        if matches!(spec.writable, crate::spec::Writable::Tmpfs { .. }) {
            tmpfs.extend(open("/").ok());
        }
        tmpfs.extend(open("/dev/shm").ok());
    }
    protocol::send(&nest.0, &"nest", &protocol::borrow_all(&tmpfs))
        .map_err(|e| Error::Setup(format!("asking for the nested id maps: {e}")))?;
    drop(tmpfs);
    if !matches!(protocol::recv::<String>(&nest.0), Ok((ref m, _)) if m == "mapped") {
        return Err(Error::Setup(
            "mapping the sandbox's nested user namespace failed".into(),
        ));
    }
    drop(nest);
    // The maps are written: from here on nothing in the sandbox may read
    // init's memory or descriptors (ptrace, /proc/1/fd, /proc/1/mem,
    // pidfd_getfd all need CAP_SYS_PTRACE over the user namespace that
    // init's memory belongs to, which is the host's: it was forked, never
    // executed, in there). Workers and transfer processes inherit it.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(errno("prctl(PR_SET_DUMPABLE)"))?;
    if launch.oneshot {
        // The caller's stderr (a terminal, a log file) stays out of reach.
        rustix::stdio::dup2_stderr(&null).map_err(errno("dup2"))?;
    }
    drop(null);
    status.send(&format!("ready {}", worker::now_ns()));
    // From now on only outer holds the status pipe.
    status.close();
    // Idle until the first request: of the pages of sifbox and its
    // libraries that setting up touched, the serve loop needs a few.
    trim();
    let activity = activity.and_then(|(pipe, proc)| {
        proc.map(|proc| Activity {
            pipe,
            proc,
            idle: false,
        })
    });
    serve(listener, spec.confinement, activity)
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
struct Activity {
    pipe: OwnedFd,
    proc: rustix::fs::Dir,
    idle: bool,
}

impl Activity {
    /// Work starts (an exec, a transfer): the watchdog samples again.
    fn busy(&mut self) {
        if self.idle {
            self.idle = false;
            let _ = rustix::io::write(&self.pipe, b"B");
        }
    }

    /// Tells outer when the sandbox has become idle: no exec running, no
    /// detached one, and no process but init and `workers` (all idle).
    fn check(&mut self, workers: &Pool, detached: &HashMap<String, Pid>) {
        if self.idle || !detached.is_empty() || workers.any_busy() {
            return;
        }
        if crate::limits::ns_pids(&mut self.proc).len() == 1 + workers.len() {
            self.idle = true;
            let _ = rustix::io::write(&self.pipe, b"I");
        }
    }
}

/// Joins a fresh session keyring. A full key quota is tolerated under the
/// default seccomp policy, which denies commands every keyring call anyway.
fn join_keyring(spec: &SandboxSpec) -> Result<()> {
    match sifbox_sys::join_new_session_keyring() {
        Ok(()) => Ok(()),
        Err(sifbox_sys::Error::JoinKeyring(e)) if e.raw_os_error() == Some(libc::ENOSYS) => Ok(()),
        Err(sifbox_sys::Error::JoinKeyring(e))
            if e.raw_os_error() == Some(libc::EDQUOT)
                && spec.confinement.seccomp == crate::spec::SeccompMode::Default =>
        {
            tracing::debug!("no session keyring of the sandbox's own ({e}); commands cannot reach keyrings under the seccomp policy");
            Ok(())
        }
        Err(sifbox_sys::Error::JoinKeyring(e)) if e.raw_os_error() == Some(libc::EDQUOT) => {
            Err(Error::Host {
                what: "giving the sandbox a session keyring of its own".into(),
                source: e,
                fix: "the user's key quota is full (kernel.keys.maxkeys); raise it, stop other sandboxes, or keep the default seccomp policy (which needs none)".into(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// An exec worker: a child of init that serves execs one after another,
/// each to its end (the command and everything it started), so that its
/// page tables are warm and no exec after the first pays for a fork.
struct Worker {
    pid: Pid,
    /// init's end of the socketpair: jobs go down, a byte per finished job
    /// comes back; closing it tells an idle worker to exit.
    chan: UnixStream,
    busy: bool,
}

/// A worker's life: jobs arrive on `chan`, each an exec request with the
/// client's connection as the first fd and the request's own fds after it;
/// it ends when init closes the channel.
fn worker_main(chan: &UnixStream, confinement: Confinement) -> i32 {
    loop {
        // No trim here: the pages of the exec path are what make the next
        // exec fast, also after an agent thought for a while.
        let Ok((req, mut fds)) = protocol::recv::<ExecRequest>(chan) else {
            return 0;
        };
        if fds.is_empty() {
            return 125;
        }
        let conn = UnixStream::from(fds.remove(0));
        worker::run(&conn, req, fds, confinement);
        drop(conn);
        if rustix::io::write(chan, b"d").is_err() {
            return 0;
        }
    }
}

/// How long init waits idle before it gives back the pages that serving
/// touched (see [`trim`]).
const IDLE_TRIM: Duration = Duration::from_secs(2);

/// Gives back freed heap and the mapped pages of code that an idle process
/// does not need; the next request faults in what it uses again.
fn trim() {
    sifbox_sys::release_free_memory();
    sifbox_sys::drop_clean_file_pages();
}

/// Whether an exec may run in a reusable worker: requests that change the
/// serving process for good (a seccomp filter, a network namespace) get a
/// process of their own.
fn reusable(req: &ExecRequest) -> bool {
    !req.fake_ids && !req.isolate_net
}

/// The exec server: one connection at a time; each exec runs in a worker
/// process (reused), each transfer in a process of its own.
fn serve(listener: UnixListener, confinement: Confinement, mut activity: Option<Activity>) -> ! {
    use rustix::event::{poll, PollFd, PollFlags};
    // As PID 1 we reap every orphan of the sandbox: SIGCHLD wakes the loop.
    let sigchld = rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
    )
    .ok()
    .and_then(|(r, w)| {
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGCHLD, File::from(w))
            .ok()
            .map(|id| (r, id))
    });
    let sigchld_id = sigchld.as_ref().map(|(_, id)| *id);
    let sigchld = sigchld.map(|(r, _)| r);
    // Detached execs by id, for `Signal`: the pid of the worker serving it.
    let mut detached: HashMap<String, Pid> = HashMap::new();
    let mut workers = Pool::default();
    // Whether anything ran since the last trim.
    let mut busy_since_trim = false;
    let idle_timeout = rustix::event::Timespec {
        tv_sec: i64::try_from(IDLE_TRIM.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(IDLE_TRIM.subsec_nanos()),
    };
    loop {
        let reaped = reap_finished();
        if !reaped.is_empty() {
            detached.retain(|_, p| !reaped.contains(p));
            workers.reaped(&reaped);
        }
        if let Some(a) = &mut activity {
            a.check(&workers, &detached);
        }
        let (listener_ready, finished) = {
            let mut fds = vec![PollFd::new(&listener, PollFlags::IN)];
            if let Some(r) = &sigchld {
                fds.push(PollFd::new(r, PollFlags::IN));
            }
            fds.extend(workers.channels().map(|c| PollFd::new(c, PollFlags::IN)));
            match poll(&mut fds, busy_since_trim.then_some(&idle_timeout)) {
                Ok(0) => {
                    drop(fds);
                    trim();
                    busy_since_trim = false;
                    continue;
                }
                Ok(_) => busy_since_trim = true,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => exit_now(125),
            }
            let base = 1 + usize::from(sigchld.is_some());
            let finished: Vec<usize> = (0..workers.len())
                .filter(|&i| !fds[base + i].revents().is_empty())
                .collect();
            (!fds[0].revents().is_empty(), finished)
        };
        if let Some(r) = &sigchld {
            let mut drain = [0u8; 64];
            while let Ok(n) = rustix::io::read(r, &mut drain) {
                if n == 0 {
                    break;
                }
            }
        }
        for &i in finished.iter().rev() {
            if let Some(pid) = workers.finished(i) {
                detached.retain(|_, p| *p != pid);
            }
        }
        workers.trim_idle();
        if !listener_ready {
            continue;
        }
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => exit_now(125),
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
        let Ok((req, fds)) = protocol::recv::<Request>(&conn) else {
            continue;
        };
        let _ = conn.set_read_timeout(None);
        if !matches!(req, Request::Ping) {
            if let Some(a) = &mut activity {
                a.busy();
            }
        }
        let ok = || Event::Ok {
            time_ns: worker::now_ns(),
        };
        match req {
            Request::Ping => {
                let _ = protocol::send(&conn, &ok(), &[]);
            }
            Request::Stop { grace_ms } => {
                stop_all(Duration::from_millis(grace_ms));
                let _ = protocol::send(&conn, &ok(), &[]);
                exit_now(0);
            }
            Request::Signal { exec_id, signal } => {
                let reply = match detached.get(&exec_id) {
                    Some(pid) => {
                        signal_exec(*pid, signal);
                        ok()
                    }
                    None => Event::Error {
                        code: 125,
                        message: format!("no running exec {exec_id:?} in this sandbox"),
                    },
                };
                let _ = protocol::send(&conn, &reply, &[]);
            }
            Request::Exec(exec) if exec.stop_after => {
                // The sandbox's last command runs right here, under PID 1,
                // which adopts whatever it leaves behind; then everything goes.
                drop((listener, activity));
                worker::run(&conn, exec, fds, confinement);
                drop(conn);
                exit_now(0);
            }
            Request::Exec(exec) if reusable(&exec) => {
                // Twice at most: a worker may have died (something in the
                // sandbox killed it) since init last looked.
                let mut outcome = Err(String::new());
                for _ in 0..2 {
                    if !workers.has_idle() {
                        match new_worker() {
                            Ok(NewWorker::Child(chan)) => {
                                // Only our own channel stays open: the
                                // client's connection and stdio come again
                                // with the job, and another worker's channel
                                // must reach EOF when init closes its end.
                                drop((listener, conn, fds, workers, sigchld, activity));
                                // The exits of a worker's commands are its
                                // own business, not a reason to wake init.
                                if let Some(id) = sigchld_id {
                                    signal_hook::low_level::unregister(id);
                                }
                                exit_now(worker_main(&chan, confinement))
                            }
                            Ok(NewWorker::Parent(w)) => workers.add(w),
                            Err(message) => {
                                outcome = Err(message);
                                break;
                            }
                        }
                    }
                    outcome = workers.dispatch(&conn, &exec, &fds);
                    if outcome.is_ok() {
                        break;
                    }
                }
                match outcome {
                    Ok(pid) => {
                        if let Some(id) = exec.detach_id {
                            detached.insert(id, pid);
                        }
                    }
                    Err(message) => {
                        let _ = protocol::send(&conn, &Event::Error { code: 125, message }, &[]);
                    }
                }
            }
            other => match sifbox_sys::fork() {
                Ok(sifbox_sys::Forked::Child) => {
                    drop((listener, workers, activity));
                    exit_now(serve_in_child(&conn, other, fds, confinement))
                }
                Ok(sifbox_sys::Forked::Parent(pid)) => {
                    if let Request::Exec(ExecRequest {
                        detach_id: Some(id),
                        ..
                    }) = other
                    {
                        detached.insert(id, pid);
                    }
                }
                Err(e) => {
                    let _ = protocol::send(
                        &conn,
                        &Event::Error {
                            code: 125,
                            message: e.to_string(),
                        },
                        &[],
                    );
                }
            },
        }
    }
}

enum NewWorker {
    Parent(Worker),
    Child(UnixStream),
}

/// Forks an exec worker connected to init by a socketpair.
fn new_worker() -> std::result::Result<NewWorker, String> {
    let (mine, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    match sifbox_sys::fork().map_err(|e| e.to_string())? {
        sifbox_sys::Forked::Child => {
            drop(mine);
            Ok(NewWorker::Child(theirs))
        }
        sifbox_sys::Forked::Parent(pid) => Ok(NewWorker::Parent(Worker {
            pid,
            chan: mine,
            busy: false,
        })),
    }
}

/// init's exec workers, and every decision about them: which is free,
/// which finished, which stays warm, which goes. The forks and the polling
/// are `serve`'s; the pool only holds the channels, so its decisions are
/// unit-tested with socketpairs and no process.
#[derive(Default)]
struct Pool {
    workers: Vec<Worker>,
}

impl Pool {
    fn len(&self) -> usize {
        self.workers.len()
    }

    fn any_busy(&self) -> bool {
        self.workers.iter().any(|w| w.busy)
    }

    fn has_idle(&self) -> bool {
        self.workers.iter().any(|w| !w.busy)
    }

    fn add(&mut self, w: Worker) {
        self.workers.push(w);
    }

    /// Forgets the workers among `pids` (reaped: they died).
    fn reaped(&mut self, pids: &[Pid]) {
        self.workers.retain(|w| !pids.contains(&w.pid));
    }

    /// The workers' channels, in order (for poll: index `i` is worker `i`).
    fn channels(&self) -> impl Iterator<Item = &UnixStream> {
        self.workers.iter().map(|w| &w.chan)
    }

    /// Worker `i`'s channel is readable: a byte says its job is done (it is
    /// free again; its pid is returned), EOF or an error that it is gone.
    fn finished(&mut self, i: usize) -> Option<Pid> {
        let w = self.workers.get_mut(i)?;
        let mut b = [0u8; 16];
        match rustix::io::read(&w.chan, &mut b) {
            Ok(n) if n > 0 => {
                w.busy = false;
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
    fn trim_idle(&mut self) {
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

    /// Hands an exec to a free worker; returns its pid. A worker that
    /// cannot take it is dropped from the pool.
    fn dispatch(
        &mut self,
        conn: &UnixStream,
        req: &ExecRequest,
        fds: &[OwnedFd],
    ) -> std::result::Result<Pid, String> {
        use std::os::fd::AsFd;
        let i = self
            .workers
            .iter()
            .position(|w| !w.busy)
            .ok_or_else(|| "no exec worker is free".to_string())?;
        let mut passed = vec![conn.as_fd()];
        passed.extend(fds.iter().map(AsFd::as_fd));
        if let Err(e) = protocol::send(&self.workers[i].chan, req, &passed) {
            self.workers.remove(i);
            return Err(format!("handing the exec to a worker: {e}"));
        }
        self.workers[i].busy = true;
        Ok(self.workers[i].pid)
    }
}

/// A request served in a process of its own: an exec or a transfer.
fn serve_in_child(
    conn: &UnixStream,
    req: Request,
    mut fds: Vec<OwnedFd>,
    confinement: Confinement,
) -> i32 {
    let reply = |r: std::io::Result<()>| {
        let ev = match r {
            Ok(()) => Event::Ok {
                time_ns: worker::now_ns(),
            },
            Err(e) => Event::Error {
                code: 125,
                message: e.to_string(),
            },
        };
        let _ = protocol::send(conn, &ev, &[]);
    };
    match req {
        Request::Exec(exec) => worker::run(conn, exec, fds, confinement),
        Request::Download { path } => {
            let Some(fd) = fds.pop() else { return 125 };
            let name = Path::new(&path)
                .file_name()
                .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned());
            let r = transfer::write_tar(Path::new(&path), &name, File::from(fd));
            let failed = r.is_err();
            reply(r.map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}"))));
            i32::from(failed)
        }
        Request::Upload { dst, name, owner } => {
            let Some(fd) = fds.pop() else { return 125 };
            let owner = match owner.as_deref().map(worker::lookup_user).transpose() {
                Ok(o) => o.map(|u| (u.uid, u.gid)),
                Err(e) => {
                    reply(Err(std::io::Error::other(e)));
                    return 125;
                }
            };
            let r = transfer::unpack_tar(File::from(fd), Path::new(&dst), &name, owner);
            let failed = r.is_err();
            reply(r.map_err(|e| std::io::Error::new(e.kind(), format!("{dst}: {e}"))));
            i32::from(failed)
        }
        Request::Extract { dst, owner } => {
            let Some(fd) = fds.pop() else { return 125 };
            let r = transfer::extract_tar(File::from(fd), Path::new(&dst), owner);
            let failed = r.is_err();
            reply(r.map_err(|e| std::io::Error::new(e.kind(), format!("{dst}: {e}"))));
            i32::from(failed)
        }
        Request::Remove { path } => {
            let r = match std::fs::remove_dir_all(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                r => r,
            };
            let failed = r.is_err();
            reply(r.map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}"))));
            i32::from(failed)
        }
        Request::Chown { path, user } => {
            let r = chown_nofollow(&path, &user);
            let failed = r.is_err();
            reply(r.map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}"))));
            i32::from(failed)
        }
        Request::MirrorOwners { dst } => {
            let r = transfer::mirror_owners(Path::new(&dst));
            let failed = r.is_err();
            reply(r.map_err(|e| std::io::Error::new(e.kind(), format!("{dst}: {e}"))));
            i32::from(failed)
        }
        Request::Snapshot => {
            let Some(fd) = fds.pop() else { return 125 };
            let r = transfer::write_root_tar(File::from(fd));
            let failed = r.is_err();
            reply(r);
            i32::from(failed)
        }
        _ => 125,
    }
}

/// `lchown(path)` to `user` of the image: the last component is not
/// followed, so a symlink planted there is chowned itself, and the lookup
/// happens inside the sandbox, where it reaches nothing of the host.
fn chown_nofollow(path: &str, user: &str) -> std::io::Result<()> {
    let u = worker::lookup_user(user).map_err(std::io::Error::other)?;
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(rustix::fs::Uid::from_raw(u.uid)),
        Some(rustix::fs::Gid::from_raw(u.gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(std::io::Error::from)
}

/// Signals a detached exec (whose subreaper is `anchor`): SIGKILL reaches
/// every process below it; other signals go to the command's process group.
fn signal_exec(anchor: Pid, signal: i32) {
    let Some(sig) = Signal::from_named_raw(signal) else {
        return;
    };
    if sig == Signal::KILL {
        for p in worker::descendants(anchor) {
            let _ = rustix::process::kill_process(p, sig);
        }
        return;
    }
    for p in worker::descendants(anchor) {
        // The command leads its own process group (or session).
        if rustix::process::getpgid(Some(p)).ok() == Some(p) {
            let _ = rustix::process::kill_process_group(p, sig);
        }
    }
}

/// Reaps every child that has exited; returns their pids.
fn reap_finished() -> Vec<Pid> {
    let mut out = Vec::new();
    while let Ok(Some((pid, _))) = rustix::process::wait(WaitOptions::NOHANG) {
        out.push(pid);
    }
    out
}

/// SIGTERM to every process of the sandbox, then up to `grace` for them to
/// end. Only init calls this, and exits right after: the kernel then
/// SIGKILLs whatever is left of its pid namespace.
fn stop_all(grace: Duration) {
    if grace.is_zero() {
        return;
    }
    let _ = sifbox_sys::kill_all(Signal::TERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && others_alive() {
        reap_finished();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether any process besides init (and the caller) remains.
fn others_alive() -> bool {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").is_ok_and(|rd| {
        rd.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.bytes().all(|b| b.is_ascii_digit()) && n != "1" && n != me.as_str()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

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
        let req = ExecRequest::default();
        assert_eq!(pool.dispatch(&conn, &req, &[]), Ok(pid(101)));
        assert!(pool.any_busy() && pool.has_idle());
        assert_eq!(pool.dispatch(&conn, &req, &[]), Ok(pid(102)));
        assert!(!pool.has_idle());
        assert!(pool.dispatch(&conn, &req, &[]).is_err(), "none is free");
        // The job reached the worker, with the client's connection.
        let (_, fds) = protocol::recv::<ExecRequest>(&far1).expect("the job");
        assert_eq!(fds.len(), 1);
        // Worker 1 says it is done: free again, and the next exec is its.
        far1.write_all(b".").expect("write");
        assert_eq!(pool.finished(0), Some(pid(101)));
        assert_eq!(pool.dispatch(&conn, &req, &[]), Ok(pid(101)));
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
        assert_eq!(pool.dispatch(&conn, &req, &[]), Ok(pid(101)));
        pool.trim_idle();
        assert_eq!(pool.len(), 1);
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
