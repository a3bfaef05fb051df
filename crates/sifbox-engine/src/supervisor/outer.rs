//! The outer supervisor: in the host's pid namespace, it makes the
//! disk-backed layer, joins the limits, makes the user and pid namespaces,
//! forks init and waits for it (mapping its nested user namespace, and
//! watching its memory without a cgroup).

use sifbox_sys::syscall::{Prctl, Syscall};

use std::fs::File;
use std::io::BufReader;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use rustix::process::{Pid, Signal, WaitOptions};
use rustix::thread::UnshareFlags;

use super::error::OuterError;
use super::handoff::Nest;
use super::init::init_main;
use super::watchdog::Watchdog;
use super::{errno, exit_now, read_line, Launch, Status};
use crate::error::{Error, Result};
use crate::idmap::{self, IdMapError};
use crate::protocol;
use crate::spec::IdMapping;

/// `listener`: the control socket when the client made it; else init makes
/// it. `given`: the disk-backed layer when the client made it. Every
/// system call that sets the sandbox up goes through `sys` (the syscall
/// seam), handed on to init.
pub(super) fn outer(
    sys: &dyn Syscall,
    launch: &Launch,
    input: &mut BufReader<File>,
    status: &mut Status,
    listener: Option<UnixListener>,
    given: Option<OwnedFd>,
    dir: OwnedFd,
) -> Result<i32> {
    // Our own hold on the sandbox's name, and on what the sandbox uses
    // (its image), for as long as we live: first, before anything could
    // tell the client we run (see `crate::runtime`).
    let mut own = launch
        .lock_id
        .map(|id| crate::runtime::hold(&launch.dir, id))
        .transpose()?;
    let mut holds = hold_all(&launch.holds)?;
    if launch.oneshot {
        sys.prctl(Prctl::ParentDeathSignal(Some(Signal::KILL)))
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
        crate::spec::Writable::Disk { .. } if launch.disk_given => {
            Some(given.ok_or(OuterError::DiskNotSent)?)
        }
        crate::spec::Writable::Disk { size_mib, scratch } => {
            let mkfs = crate::disk::mkfs_path().ok_or(OuterError::NoMkfs)?;
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
    set_rlimits(&launch.limits)?;

    sys.unshare(UnshareFlags::NEWUSER | UnshareFlags::NEWPID).map_err(|e| Error::Host {
        what: "creating the sandbox's user and pid namespaces".into(),
        source: e.into(),
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
        map_single(sys, ids.uid[0].outside, ids.gid[0].outside)?;
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
            // Host files the sandbox's processes must not inherit.
            drop((own.take(), std::mem::take(&mut holds)));
            drop((nest_outer, activity_outer));
            let nest = Nest(nest_init);
            let code = match init_main(
                sys,
                launch,
                status,
                nest,
                listener,
                disk,
                activity_init,
                dir,
            ) {
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
    let waited = wait_init(sys, init, launch, nest_outer, activity_outer, input);
    // The kernel's kills too, read while the cgroup is still there.
    let cgroup_kills = launch
        .limits
        .cgroup
        .as_ref()
        .and_then(crate::limits::cgroup::SandboxCgroup::oom_kills)
        .unwrap_or(0);
    if let Some(cg) = &launch.limits.cgroup {
        // Out of the cgroup, which goes with the sandbox.
        if let Err(e) = cg.remove(std::process::id()) {
            tracing::warn!("removing the sandbox's cgroup: {e}");
        }
    }
    let oom_kills = waited?.max(cgroup_kills);
    // The client reads why a sandbox went after its runtime dir is gone.
    status.send(&format!("exited 0 oom_kills={oom_kills}"));
    crate::runtime::remove_dir(&launch.dir)?;
    drop((own, holds));
    Ok(0)
}

/// Maps outer's own user namespace, single mode: uid and gid 0 to the
/// caller's ids; setgroups denied first (the kernel refuses an
/// unprivileged gid_map before).
fn map_single(sys: &dyn Syscall, uid: u32, gid: u32) -> std::result::Result<(), IdMapError> {
    idmap::write_file(sys, Path::new("/proc/self/setgroups"), "deny\n")?;
    idmap::write_file(
        sys,
        Path::new("/proc/self/uid_map"),
        &format!("0 {uid} 1\n"),
    )?;
    idmap::write_file(
        sys,
        Path::new("/proc/self/gid_map"),
        &format!("0 {gid} 1\n"),
    )
}

/// Maps init's nested user namespace (process `init`) onto outer's ids
/// one to one: uid_map, then gid_map; the first failure stops.
fn map_nested(
    sys: &dyn Syscall,
    init: i32,
    ids: &IdMapping,
) -> std::result::Result<(), IdMapError> {
    let proc = PathBuf::from(format!("/proc/{init}"));
    idmap::write_file(
        sys,
        &proc.join("uid_map"),
        &idmap::map_text(&idmap::identity_of(&ids.uid)),
    )?;
    idmap::write_file(
        sys,
        &proc.join("gid_map"),
        &idmap::map_text(&idmap::identity_of(&ids.gid)),
    )
}

/// Takes a shared hold on each of `paths` (`StartOptions::holds`); the
/// client holds them too until we do, so none is missing or being removed.
fn hold_all(paths: &[PathBuf]) -> Result<Vec<File>> {
    use sifbox_sys::lockfile::{lock, Kind};
    let mut out = Vec::new();
    for p in paths {
        match lock(p, Kind::Shared, false, false, 0) {
            Ok(Some(f)) => out.push(f),
            Ok(None) => return Err(OuterError::BeingRemoved(p.clone()).into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!("{}: gone, not held", p.display());
            }
            Err(e) => return Err(Error::io(format!("locking {}", p.display()), e)),
        }
    }
    Ok(out)
}

/// What the client's end of the control pipe says once the sandbox runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// Still there, not detached.
    Attached,
    /// Detached: the sandbox runs on without it (`sifbox start`).
    Detached,
    /// Gone without detaching (killed, say): the sandbox ends.
    Gone,
}

/// Reads what is on the control pipe now.
fn read_client(input: &mut BufReader<File>) -> Client {
    use std::io::Read as _;
    if input.buffer().windows(6).any(|w| w == b"detach") {
        return Client::Detached;
    }
    let mut buf = [0u8; 64];
    loop {
        match input.get_mut().read(&mut buf) {
            Ok(0) => return Client::Gone,
            Ok(n) if buf[..n].windows(6).any(|w| w == b"detach") => return Client::Detached,
            Ok(_) => return Client::Attached,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Client::Gone,
        }
    }
}

/// The rlimits that must be set before the sandbox's user namespace is
/// made: `RLIMIT_NOFILE` (raising a hard limit needs privilege in the
/// host's user namespace, which root loses once inside) and the user-wide
/// `RLIMIT_NPROC`, which the kernel keeps for the new namespace as the
/// cap on its creator's uid, every process of that uid on the host
/// counted (ucounts, Linux 5.14): so all the caller's sandboxes together
/// stay below it, whatever ids their processes have inside.
fn set_rlimits(limits: &crate::limits::Enforcement) -> Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    if let Some((soft, hard)) = limits.nofile {
        let set = |soft: u64, hard: Option<u64>| {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(soft),
                    maximum: hard,
                },
            )
        };
        match set(soft, Some(hard)) {
            // CAP_SYS_RESOURCE held in a user namespace of the caller's
            // (`unshare -Ur`) does not raise a hard limit: then it stays.
            Err(rustix::io::Errno::PERM) => {
                let held = rustix::process::getrlimit(Resource::Nofile).maximum;
                set(held.map_or(soft, |h| soft.min(h)), held)
                    .map_err(errno("setrlimit(RLIMIT_NOFILE)"))?;
            }
            other => other.map_err(errno("setrlimit(RLIMIT_NOFILE)"))?,
        }
    }
    if let Some(n) = limits.user_nproc {
        setrlimit(
            Resource::Nproc,
            Rlimit {
                current: Some(n),
                maximum: Some(n),
            },
        )
        .map_err(errno("setrlimit(RLIMIT_NPROC) for user_pids"))?;
    }
    Ok(())
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

/// How long a sandbox runs before outer gives back the mapped pages of
/// setting it up (`sifbox_sys::drop_clean_file_pages`).
const TRIM_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits for init, and maps its nested user namespace when it asks;
/// SIGTERM/SIGINT/SIGHUP to outer stop the sandbox at once. With a memory
/// limit and no cgroup, this is also the watchdog (see [`Watchdog`]).
fn wait_init(
    sys: &dyn Syscall,
    init: Pid,
    launch: &Launch,
    nest: UnixStream,
    activity: Option<OwnedFd>,
    input: &mut BufReader<File>,
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
    // When to unmap the pages setting up touched (see below).
    let mut trim_at: Option<std::time::Instant> = None;
    let mut client = if input.buffer().windows(6).any(|w| w == b"detach") {
        Client::Detached
    } else {
        Client::Attached
    };
    loop {
        let mut fds = vec![
            PollFd::new(&pidfd, PollFlags::IN),
            PollFd::new(&sig_r, PollFlags::IN),
        ];
        let client_at = fds.len();
        if client == Client::Attached {
            fds.push(PollFd::new(input.get_ref(), PollFlags::IN));
        }
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
        let watch_ms = watchdog
            .as_ref()
            .filter(|w| w.armed() && !w.idle)
            .map(|w| w.next_ms);
        let trim_ms = trim_at.map(|t| {
            u64::try_from(
                t.saturating_duration_since(std::time::Instant::now())
                    .as_millis(),
            )
            .unwrap_or(u64::MAX)
        });
        let timeout = match (watch_ms, trim_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(|ms| Timespec {
            tv_sec: i64::try_from(ms / 1000).unwrap_or(1),
            tv_nsec: i64::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
        });
        let ready = match poll(&mut fds, timeout.as_ref()) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(errno("poll")(e)),
        };
        let (init_done, signalled) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        let client_said = client == Client::Attached && !fds[client_at].revents().is_empty();
        let nest_ready = nest.is_some() && !fds[nest_at].revents().is_empty();
        let activity_ready = fds
            .get(watch_at + 1)
            .is_some_and(|f| !f.revents().is_empty());
        drop(fds);
        if trim_at.is_some_and(|t| std::time::Instant::now() >= t) {
            trim_at = None;
            sifbox_sys::drop_clean_file_pages();
        }
        if client_said {
            client = read_client(input);
        }
        if signalled || client == Client::Gone {
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
                    if map_nested(sys, init.as_raw_nonzero().get(), &spec.ids).is_ok() {
                        let _ = protocol::send(&n, &"mapped", &[]);
                    }
                    // On failure init reads EOF and reports it.
                }
                // Every map is written (not before: init is forked from
                // us, and a non-dumpable parent would make its children's
                // /proc files, its uid_map too, host root's): from now on
                // only our own code reads our memory and descriptors.
                let _ = sys.prctl(Prctl::NotDumpable);
                // All that is left to do is wait (and watch): the pages of
                // setting up need not stay mapped, once the sandbox has
                // lived a moment (most of eval's live a few ms: reading
                // smaps would cost them more than it saves).
                trim_at = Some(std::time::Instant::now() + TRIM_AFTER);
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use rustix::io::Errno;
    use sifbox_sys::syscall::fake::{Call, Obj, Recorder};

    use super::{map_nested, map_single};
    use crate::spec::{IdMapping, IdRange, UsernsMode};

    /// The id-map writes `sys` recorded: (path, text, failed).
    fn writes(sys: &Recorder) -> Vec<(PathBuf, String, Option<Errno>)> {
        sys.calls()
            .into_iter()
            .filter_map(|e| match e.call {
                Call::WriteFile {
                    at: Obj::Host(p),
                    data,
                } => Some((p, String::from_utf8_lossy(&data).into_owned(), e.failed)),
                _ => None,
            })
            .collect()
    }

    fn w(p: &str, text: &str) -> (PathBuf, String, Option<Errno>) {
        (PathBuf::from(p), text.to_string(), None)
    }

    #[test]
    fn single_mode_denies_setgroups_before_it_maps_uid_then_gid() {
        let sys = Recorder::new();
        map_single(&sys, 1001, 1002).expect("mapped");
        assert_eq!(
            writes(&sys),
            [
                w("/proc/self/setgroups", "deny\n"),
                w("/proc/self/uid_map", "0 1001 1\n"),
                w("/proc/self/gid_map", "0 1002 1\n"),
            ]
        );
    }

    #[test]
    fn a_refused_map_write_names_the_file_and_errno_and_writes_no_more() {
        let sys = Recorder::new();
        sys.fail("write_file", 2, Errno::PERM);
        let err = map_single(&sys, 1001, 1002).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "writing /proc/self/uid_map: Operation not permitted (os error 1)"
        );
        assert_eq!(
            writes(&sys).len(),
            2,
            "no gid_map after the refused uid_map"
        );

        let ids = IdMapping {
            mode: UsernsMode::Full,
            uid: vec![
                IdRange {
                    inside: 0,
                    outside: 1001,
                    count: 1,
                },
                IdRange {
                    inside: 1,
                    outside: 100_000,
                    count: 65536,
                },
            ],
            gid: vec![IdRange {
                inside: 0,
                outside: 1002,
                count: 1,
            }],
            external: true,
        };
        let sys = Recorder::new();
        map_nested(&sys, 42, &ids).expect("mapped");
        // init's namespace maps onto outer's one to one.
        assert_eq!(
            writes(&sys),
            [
                w("/proc/42/uid_map", "0 0 1\n1 1 65536\n"),
                w("/proc/42/gid_map", "0 0 1\n"),
            ]
        );
        let sys = Recorder::new();
        sys.fail("write_file", 1, Errno::INVAL);
        let err = map_nested(&sys, 42, &ids).expect_err("refused");
        assert!(err.to_string().contains("/proc/42/uid_map"), "{err}");
        assert_eq!(writes(&sys).len(), 1);
    }
}
