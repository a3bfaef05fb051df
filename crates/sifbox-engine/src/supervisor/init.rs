//! init, the sandbox's PID 1: its namespaces, root file system and
//! nested user namespace, then the exec server ([`super::serve`]).

use sifbox_sys::syscall::{Prctl, Syscall};

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use rustix::process::{Pid, Signal, WaitOptions};
use rustix::thread::UnshareFlags;

use super::error::InitError;
use super::handoff::{Activity, KeptLayer, Nest};
use super::serve::serve;
use super::{errno, exit_now, Launch, Status};
use crate::error::{Error, Result};
use crate::protocol::{self, CONTROL_SOCKET};
use crate::spec::{NetMode, SandboxSpec};
use crate::{rootfs, worker};

/// PID 1 of the sandbox. Every system call that sets the sandbox up goes
/// through `sys` (the syscall seam).
#[allow(clippy::too_many_arguments)]
pub(super) fn init_main(
    sys: &dyn Syscall,
    launch: &Launch,
    status: &mut Status,
    nest: Nest,
    listener: Option<UnixListener>,
    disk: Option<OwnedFd>,
    activity: Option<OwnedFd>,
    held_dir: OwnedFd,
) -> Result<()> {
    sys.prctl(Prctl::ParentDeathSignal(Some(Signal::KILL)))
        .map_err(errno("prctl(PR_SET_PDEATHSIG)"))?;
    let spec = &launch.spec;
    // The dir a kept layer is copied into, opened while the host's paths
    // are still in reach; the copy comes when the sandbox stops.
    let keep_dst = match &spec.keep_layer {
        Some(p) => Some(
            rustix::fs::open(
                p,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| Error::io(format!("opening {}", p.display()), e))?,
        ),
        None => None,
    };
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
    // Where the runtime dir (held as a descriptor) is, looked up again in
    // the new mount namespace below: mounts go on its own mounts only.
    let shown = std::fs::canonicalize(&launch.dir)
        .map_err(|e| Error::io(format!("resolving {}", launch.dir.display()), e))?;
    unshare_sandbox_namespaces(sys, spec)?;
    let dir = crate::runtime::same_dir_here(&launch.dir, &shown)?;
    let views = launch
        .limits
        .cgroup
        .as_ref()
        .map(crate::limits::cgroup::SandboxCgroup::views)
        .unwrap_or_default();
    let mut root = rootfs::assemble(sys, spec, &dir, disk, views)?;
    let keep = match (root.upper.take(), keep_dst) {
        (Some(upper), Some(dst)) => Some(KeptLayer { upper, dst }),
        _ => None,
    };
    // The writable clones of the guarded binds, mounted in the guarded
    // mount namespace once the nested user namespace is made.
    let guarded = root.take_guarded();
    if spec.net == NetMode::None {
        sifbox_sys::loopback_up()?;
    }
    sys.sethostname(spec.hostname.as_bytes())
        .map_err(errno("sethostname"))?;
    let listener = match listener {
        Some(l) => l,
        None => {
            // A relative name: runtime dir paths can be longer than a socket
            // address allows.
            sys.chdir(&dir).map_err(errno("chdir to the runtime dir"))?;
            UnixListener::bind(CONTROL_SOCKET)
                .map_err(|e| Error::io(format!("creating {}/{CONTROL_SOCKET}", dir.display()), e))?
        }
    };
    // The host's runtime dir, which `launch.dir` named, goes before the
    // sandbox's root is entered: no descriptor of a host dir stays in init.
    drop(held_dir);
    rootfs::pivot(sys, &root)?;
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
        // Not above the user-wide cap outer set (a hard limit only goes
        // down here).
        let n = rustix::process::getrlimit(rustix::process::Resource::Nproc)
            .maximum
            .map_or(n, |h| n.min(h));
        let l = rustix::process::Rlimit {
            current: Some(n),
            maximum: Some(n),
        };
        rustix::process::setrlimit(rustix::process::Resource::Nproc, l)
            .map_err(errno("setrlimit(RLIMIT_NPROC)"))?;
    }
    sys.unshare(UnshareFlags::NEWUSER)
        .map_err(|e| Error::io("creating the nested user namespace", e))?;
    // The guarded mount namespace is made meanwhile by a child in the
    // nested user namespace (nothing of the sandbox runs yet); its fd is
    // taken once the maps are written.
    let guarded = if guarded.is_empty() {
        None
    } else {
        Some(start_guarded_namespace(sys, &guarded)?)
    };
    let mut activity = activity.map(|pipe| (pipe, None));
    let tmpfs = watched_mounts(launch, &mut activity)?;
    protocol::send(&nest.0, &"nest", &protocol::borrow_all(&tmpfs)).map_err(InitError::AskMaps)?;
    drop(tmpfs);
    if !matches!(protocol::recv::<String>(&nest.0), Ok((ref m, _)) if m == "mapped") {
        return Err(InitError::NotMapped.into());
    }
    drop(nest);
    // The maps are written: from here on nothing in the sandbox may read
    // init's memory or descriptors (ptrace, /proc/1/fd, /proc/1/mem,
    // pidfd_getfd all need CAP_SYS_PTRACE over the user namespace that
    // init's memory belongs to, which is the host's: it was forked, never
    // executed, in there). Workers and transfer processes inherit it.
    sys.prctl(Prctl::NotDumpable)
        .map_err(errno("prctl(PR_SET_DUMPABLE)"))?;
    let guarded = guarded.map(finish_guarded_namespace).transpose()?;
    if launch.oneshot {
        // The caller's stderr (a terminal, a log file) stays out of reach.
        rustix::stdio::dup2_stderr(&null).map_err(errno("dup2"))?;
    }
    drop(null);
    status.send(&format!("ready {}", worker::now_ns()));
    // From now on only outer holds the status pipe.
    status.close();
    // The pages of sifbox that setting up touched are given back once the
    // sandbox has been idle a moment (the serve loop's first trim), not
    // now: most of eval's sandboxes live a few ms, and the requests that
    // come at once would fault them back in (and so would every process
    // forked for them).
    let activity = activity.and_then(|(pipe, proc)| {
        proc.map(|proc| Activity {
            pipe,
            proc,
            idle: false,
        })
    });
    serve(listener, spec.confinement, activity, keep, guarded)
}

/// The sandbox's mount, ipc, uts and cgroup namespaces (and network, for
/// `--net none`); the host's supplementary groups dropped where allowed.
fn unshare_sandbox_namespaces(sys: &dyn Syscall, spec: &SandboxSpec) -> Result<()> {
    // A cgroup namespace rooted at the sandbox's own cgroup (outer joined
    // it): /proc/self/cgroup shows "/" and no host path, and a cgroup file
    // system mounted inside (with nested namespaces) shows nothing above.
    let mut flags =
        UnshareFlags::NEWNS | UnshareFlags::NEWIPC | UnshareFlags::NEWUTS | UnshareFlags::NEWCGROUP;
    if spec.net == NetMode::None {
        flags |= UnshareFlags::NEWNET;
    }
    sys.unshare(flags).map_err(|e| Error::Host {
        what: "creating the sandbox's mount, ipc, uts, cgroup and network namespaces".into(),
        source: e.into(),
        fix: "run `sifbox doctor` to see what this host allows".into(),
    })?;
    // Host supplementary groups do not follow into the sandbox where the
    // kernel lets us drop them (not in single-id namespaces).
    let _ = rustix::thread::set_thread_groups(&[]);
    Ok(())
}

/// What the memory watchdog measures (the root, whose statfs is the
/// writable layer's tmpfs, and /dev/shm; /proc, to list the sandbox's
/// processes), opened in the new root; `activity` gets its own /proc to
/// tell when the sandbox is idle. Nothing without a watchdog.
fn watched_mounts(
    launch: &Launch,
    activity: &mut Option<(OwnedFd, Option<rustix::fs::Dir>)>,
) -> Result<Vec<OwnedFd>> {
    let mut tmpfs = Vec::new();
    if launch.limits.watchdog_memory.is_none() {
        return Ok(tmpfs);
    }
    // The watchdog lists the sandbox's processes in its /proc; so does
    // init, to tell it when the sandbox is idle.
    match rustix::fs::open(
        "/proc",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => {
            if let Some((_, proc)) = activity {
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
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
    };
    if matches!(launch.spec.writable, crate::spec::Writable::Tmpfs { .. }) {
        tmpfs.extend(open("/").ok());
    }
    tmpfs.extend(open("/dev/shm").ok());
    Ok(tmpfs)
}

/// Starts making the guarded mount namespace (see
/// [`crate::spec::GuardedBind`]); [`finish_guarded_namespace`] takes it.
/// A child of init in the nested user namespace unshares a mount
/// namespace of its own (a copy of the sandbox's, in which every mount is
/// locked, as it comes from a more privileged one) and mounts each
/// writable clone in `trees` over its read-only bind. init keeps an fd of
/// that namespace, which keeps it alive; only the processes that serve
/// guarded requests enter it ([`super::serve`]). Nothing in the sandbox
/// can reach it through init or the child: init is not dumpable (no
/// /proc/1/fd, no /proc/1/ns), and the child is gone before anything
/// runs in the sandbox.
fn start_guarded_namespace(
    sys: &dyn Syscall,
    trees: &[(PathBuf, OwnedFd)],
) -> Result<(Pid, UnixStream)> {
    use std::os::fd::AsFd;
    let (mine, theirs) = UnixStream::pair()
        .map_err(|e| Error::io("making the guarded mount namespace: socketpair", e))?;
    match sifbox_sys::fork()? {
        sifbox_sys::Forked::Child => {
            drop(mine);
            let made = sys
                .unshare(UnshareFlags::NEWNS)
                .map_err(|e| format!("unshare(CLONE_NEWNS): {}", std::io::Error::from(e)))
                .and_then(|()| rootfs::attach_guarded(sys, trees).map_err(|e| e.to_string()))
                .and_then(|()| {
                    rustix::fs::open(
                        "/proc/self/ns/mnt",
                        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                        rustix::fs::Mode::empty(),
                    )
                    .map_err(|e| format!("opening /proc/self/ns/mnt: {e}"))
                });
            let code = match made {
                Ok(ns) => {
                    let sent = protocol::send(&theirs, &String::new(), &[ns.as_fd()]);
                    i32::from(sent.is_err())
                }
                Err(e) => {
                    let _ = protocol::send(&theirs, &e, &[]);
                    1
                }
            };
            exit_now(code)
        }
        sifbox_sys::Forked::Parent(pid) => {
            drop(theirs);
            Ok((pid, mine))
        }
    }
}

/// The guarded mount namespace that the child [`start_guarded_namespace`]
/// forked made, as an fd (an error saying why when it could not).
fn finish_guarded_namespace((pid, mine): (Pid, UnixStream)) -> Result<OwnedFd> {
    let got = protocol::recv::<String>(&mine);
    match got {
        // The child is not waited for (its exit, the teardown of a copy
        // of init's address space, takes a millisecond): the serve loop
        // reaps it as any child.
        Ok((why, mut fds)) if why.is_empty() && fds.len() == 1 => fds
            .pop()
            .ok_or_else(|| InitError::GuardedNamespace { why: String::new() }.into()),
        other => {
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
            let why = match other {
                Ok((why, _)) => why,
                Err(e) => e.to_string(),
            };
            Err(InitError::GuardedNamespace { why }.into())
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
