//! Starting a sandbox: the runtime dir, the limits' mechanisms, the
//! supervisor (forked, or executed from a multi-threaded client) and the
//! wait for its "ready".

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::pipe::{pipe_with, PipeFlags};
use rustix::process::Pid;
use sifbox_sys::syscall::Kernel;

use super::{read_status, Evidencing, OverlayProblem, Sandbox, SandboxError, StartOptions, Status};
use crate::error::{Error, IoContext, Result};
use crate::evidence::{self, ImageRef};
use crate::idmap;
use crate::protocol::{self, CONTROL_SOCKET};
use crate::runtime::{self, State};
use crate::spec::{SandboxSpec, Writable};
use crate::supervisor::{self, Launch, SUPERVISOR_ARG};

/// Plans how `spec`'s limits are enforced here and makes the sandbox's
/// cgroup when one enforces them; a cgroup that cannot be made leaves the
/// fallbacks (said in the record).
fn enforce_limits(spec: &SandboxSpec) -> Result<crate::limits::Enforcement> {
    use crate::limits::{self, cgroup::CgroupLimits};
    let host = limits::Host::detect_recent();
    let seed = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        spec.name.hash(&mut h);
        std::process::id().hash(&mut h);
        h.finish()
    };
    let mut e = limits::plan(&spec.limits, &host, seed);
    limits::plan_storage(&mut e, &spec.writable);
    let wants_cgroup = e
        .applied
        .iter()
        .any(|a| matches!(a.how, limits::How::CgroupV1 | limits::How::CgroupV2));
    if let (true, Some(h)) = (wants_cgroup, &host.cgroup) {
        let l = &spec.limits;
        let cl = CgroupLimits {
            memory: l.memory.filter(|_| h.can("memory")),
            memory_swap: l.swap_total().filter(|_| h.can("swap")),
            pids: l.pids.filter(|_| h.can("pids")),
            cpus_milli: l.cpus_milli.filter(|_| h.can("cpu")),
            user_pids: l.user_pids.filter(|_| h.can("pids")),
        };
        match h.create(&Kernel, &spec.name, &cl) {
            Ok(cg) => e.cgroup = Some(cg),
            Err(err) => {
                let host = limits::Host {
                    cgroup: None,
                    ..host
                };
                e = limits::plan(&spec.limits, &host, seed);
                limits::plan_storage(&mut e, &spec.writable);
                e.not_enforced.push(format!(
                    "cgroup: could not make the sandbox's cgroup ({err}); using the fallbacks"
                ));
            }
        }
    }
    // Affinity grants whole CPUs: a fraction rounded up is said.
    let asked = spec.limits.cpus_milli.map(u64::from);
    if let Some(a) = e.applied.iter().find(|a| {
        a.limit == "cpus" && matches!(a.how, limits::How::Affinity) && Some(a.value) != asked
    }) {
        tracing::warn!(
            "sandbox {}: a CPU limit of {:.3} is enforced as {} whole CPUs ({}): without a \
             cgroup, CPU affinity grants whole CPUs",
            spec.name,
            asked.unwrap_or(0) as f64 / 1000.0,
            a.value / 1000,
            a.detail
        );
    }
    Ok(e)
}

/// Starts the outer supervisor; returns its pid, the control pipe's write end
/// and the status pipe's read end.
///
/// A single-threaded client forks it directly (no exec: about a millisecond
/// less per sandbox); a multi-threaded one (an async runtime) must re-execute
/// the sifbox binary so that the supervisor starts single-threaded.
fn launch_supervisor(launch: &Launch, dir: OwnedFd, opts: &StartOptions) -> Result<Launched> {
    // The caller's disk-backed layer, a descriptor of the supervisor's own.
    let disk = opts
        .disk_layer
        .as_ref()
        .map(|fd| rustix::io::fcntl_dupfd_cloexec(&**fd, 3))
        .transpose()
        .map_err(|e| Error::io("duplicating the disk-backed layer", std::io::Error::from(e)))?;
    if opts.fork_when_possible && sifbox_sys::thread_count().ok() == Some(1) {
        let (control_r, control_w) =
            pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let (status_r, status_w) =
            pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        // Made here, so that requests can be queued while the sandbox sets
        // itself up; the supervisor inherits it.
        let listener = bind_control_socket(dir.as_fd(), &launch.dir)?;
        match sifbox_sys::fork()? {
            sifbox_sys::Forked::Child => {
                drop((control_w, status_r));
                exit_now(supervisor::main_forked(
                    launch, dir, control_r, status_w, listener, disk,
                ))
            }
            sifbox_sys::Forked::Parent(pid) => {
                return Ok(Launched {
                    pid,
                    control: control_w,
                    status: status_r,
                    listening: true,
                })
            }
        }
    }
    // The control channel is a socket: the launch goes down it as a frame
    // that can carry descriptors (the disk-backed layer).
    let (control, theirs) = std::os::unix::net::UnixStream::pair()
        .ctx(|| "a socketpair for the supervisor".to_string())?;
    let mut child = Command::new(&opts.supervisor_exe)
        .arg0("sifbox")
        .arg(SUPERVISOR_ARG)
        // Room in the argument block for the title `sifbox sandbox NAME`
        // (see supervisor::TITLE); the supervisor reads nothing from it.
        .arg(&launch.spec.name)
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .ctx(|| format!("starting the supervisor {}", opts.supervisor_exe.display()))?;
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| SandboxError::PidOutOfRange(child.id()))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(SandboxError::PipesMissing.into());
    };
    // The runtime dir goes as a descriptor, first: the supervisor reaches
    // it through that, never by a path resolved again.
    let passed: Vec<_> = std::iter::once(dir.as_fd())
        .chain(disk.iter().map(AsFd::as_fd))
        .collect();
    protocol::send(&control, launch, &passed).map_err(|e| Error::Protocol {
        name: launch.spec.name.clone(),
        why: format!("sending the launch to the supervisor: {e}"),
    })?;
    drop(disk);
    // `child` is reaped with waitpid by pid; std's handle is not needed.
    drop(child);
    Ok(Launched {
        pid,
        control: OwnedFd::from(control),
        status: OwnedFd::from(stdout),
        listening: false,
    })
}

/// A supervisor just started.
struct Launched {
    pid: Pid,
    /// Write end of its control pipe.
    control: OwnedFd,
    /// Read end of its status pipe.
    status: OwnedFd,
    /// Whether the control socket exists already.
    listening: bool,
}

/// Creates the control socket of the sandbox whose runtime dir is open
/// as `dir` (found at `path`, for messages).
fn bind_control_socket(dir: BorrowedFd<'_>, path: &Path) -> Result<UnixListener> {
    UnixListener::bind(sifbox_sys::fd_path(dir).join(CONTROL_SOCKET))
        .map_err(|e| Error::io(format!("creating {}/{CONTROL_SOCKET}", path.display()), e))
}

#[allow(
    clippy::exit,
    reason = "a forked supervisor ends here, never returning into the client"
)]
pub(super) fn exit_now(code: i32) -> ! {
    std::process::exit(code)
}

/// Removes a half-made runtime dir unless disarmed.
struct DirGuard(Option<PathBuf>);

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = runtime::remove_dir(&d);
        }
    }
}

fn send_line(w: &mut File, line: &str) -> Result<()> {
    w.write_all(format!("{line}\n").as_bytes())
        .ctx(|| "talking to the supervisor".to_string())
}

impl Sandbox {
    /// Starts a sandbox and returns once it accepts commands.
    pub fn start(spec: SandboxSpec, opts: &StartOptions) -> Result<Sandbox> {
        let sandbox = Sandbox::launch(spec, opts)?;
        sandbox.wait_ready()?;
        Ok(sandbox)
    }

    /// Starts a sandbox and returns as soon as requests can be queued: its
    /// control socket exists and its id maps are written, while it may still
    /// be assembling its root. A request sent now is served once it is
    /// ready; a setup failure is reported by whichever call waits for it
    /// first. A one-shot `run` saves a round trip this way.
    pub fn launch(spec: SandboxSpec, opts: &StartOptions) -> Result<Sandbox> {
        spec.validate()?;
        let root = runtime::root()?;
        if let Err(e) = runtime::reap_dead(&root) {
            tracing::warn!("could not clean up dead sandboxes: {e}");
        }
        let reservation = runtime::reserve(&root, &spec.name)?;
        let dir = reservation.dir.clone();
        let mut guard = DirGuard(Some(dir.clone()));
        std::fs::create_dir(dir.join("m")).ctx(|| format!("creating {}/m", dir.display()))?;
        if let Writable::Overlay { dir: o } = &spec.writable {
            // DIR is the caller's alone (0700): what the sandbox writes in
            // upper/ (a setuid-root file, under host root) must be out of
            // other users' reach. upper/ keeps the mode it is made with:
            // the overlay's root takes it, and it is the sandbox's `/`.
            let bad = |problem| -> Error {
                SandboxError::OverlayDir {
                    dir: o.clone(),
                    problem,
                }
                .into()
            };
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(o)
                .map_err(|e| bad(OverlayProblem::Create(e)))?;
            let top = rustix::fs::open(
                o,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| bad(OverlayProblem::Open(e.into())))?;
            let st = rustix::fs::fstat(&top).map_err(|e| bad(OverlayProblem::Stat(e.into())))?;
            if st.st_uid != rustix::process::geteuid().as_raw() {
                return Err(bad(OverlayProblem::Owner(st.st_uid)));
            }
            if st.st_mode & 0o077 != 0 {
                rustix::fs::fchmod(&top, rustix::fs::Mode::from_raw_mode(0o700))
                    .map_err(|e| bad(OverlayProblem::Private(e.into())))?;
                tracing::debug!(
                    "the overlay directory {}: mode {:04o} made 0700",
                    o.display(),
                    st.st_mode & 0o7777
                );
            }
            for (sub, mode) in [("upper", 0o777), ("work", 0o700)] {
                match rustix::fs::mkdirat(&top, sub, rustix::fs::Mode::from_raw_mode(mode)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => {
                        return Err(bad(OverlayProblem::Subdir {
                            sub,
                            source: e.into(),
                        }))
                    }
                }
            }
        }
        if opts.disk_layer.is_some() && !matches!(spec.writable, Writable::Disk { .. }) {
            return Err(SandboxError::DiskLayerNotWanted.into());
        }
        if let Writable::Disk { size_mib, scratch } = &spec.writable {
            if let Some(why) = crate::disk::unavailable() {
                return Err(SandboxError::DiskUnavailable {
                    size_mib: *size_mib,
                    why,
                }
                .into());
            }
            crate::disk::prepare_scratch(scratch)?;
        }

        let image = opts.image.clone().unwrap_or_else(|| ImageRef {
            reference: spec.rootfs.display().to_string(),
            digest: None,
            rootfs: spec.rootfs.clone(),
        });
        // A one-shot sandbox without a logs dir would write its record into
        // a runtime dir that is gone when it ends: it keeps none.
        let evidence_path = (!opts.oneshot || opts.evidence_dir.is_some()).then(|| {
            opts.evidence_dir
                .as_deref()
                .unwrap_or(&dir)
                .join(evidence::FILE)
        });
        let limits = enforce_limits(&spec)?;
        // The supervisor gets the dir as a descriptor (and names it by it).
        let dir_fd = rustix::fs::open(
            &dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::io(format!("opening {}", root.shown(&dir).display()), e))?;
        let launch = Launch {
            spec,
            dir: sifbox_sys::fd_path(dir_fd.as_fd()),
            oneshot: opts.oneshot,
            client_pid: i32::try_from(std::process::id()).unwrap_or_default(),
            limits,
            lock_id: Some(reservation.lock_id),
            holds: opts.holds.clone(),
            disk_given: opts.disk_layer.is_some(),
        };
        let Launched {
            pid,
            control,
            status,
            listening,
        } = launch_supervisor(&launch, dir_fd, opts)?;
        let mut control = File::from(control);
        let mut status = BufReader::new(File::from(status));
        let sandbox = Sandbox {
            reservation: RefCell::new(Some(reservation.lock)),
            control: None,
            name: launch.spec.name.clone(),
            dir: dir.clone(),
            supervisor: Some(pid),
            status: RefCell::new(None),
            ready: Cell::new(false),
            ready_time_ns: Cell::new(0),
            is_child: true,
            evidence: RefCell::new(match &evidence_path {
                None => Evidencing::None,
                Some(path) => Evidencing::Pending {
                    path: path.clone(),
                    spec: Box::new(launch.spec.clone()),
                    image: image.clone(),
                },
            }),
            stop_inside_ns: Cell::new(0),
            stopping: Cell::new(false),
            stop_asked: Cell::new(false),
            denied: RefCell::new(Vec::new()),
            limits: launch.limits.clone(),
        };
        guard.0 = None; // the Sandbox's Drop cleans up from here on
        let pid = pid.as_raw_nonzero().get();
        let spec = &launch.spec;
        let state = State {
            name: spec.name.clone(),
            supervisor_pid: pid,
            supervisor_start: runtime::process_start_time(pid).unwrap_or_default(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
            rootfs: spec.rootfs.clone(),
            oneshot: opts.oneshot,
            evidence: evidence_path.as_deref().map(|p| root.shown(p)),
            image: image.reference.clone(),
            digest: image.digest.clone(),
            limits: launch.limits.clone(),
            hidden: opts.hidden,
        };
        runtime::write_state(&dir, &state)?;
        if spec.ids.external {
            let first = read_status(&mut status, &sandbox.name);
            // The supervisor holds the name itself once it says anything.
            sandbox.reservation.replace(None);
            match first? {
                Status::Unshared => {
                    let caller = idmap::Caller::current();
                    if let Err(e) = idmap::write_external(&Kernel, pid, &spec.ids, &caller) {
                        let _ = send_line(&mut control, "abort");
                        return Err(e);
                    }
                    send_line(&mut control, "mapped")?;
                }
                Status::Ready(_) => {
                    return Err(SandboxError::ReadyBeforeMapped(sandbox.name.clone()).into())
                }
            }
        }
        // Kept until the sandbox is detached (or this handle dropped): the
        // supervisor takes its end closing before then for the client's
        // death, and ends the sandbox.
        let mut sandbox = sandbox;
        sandbox.control = Some(control);
        *sandbox.status.borrow_mut() = Some(status);
        if !listening {
            sandbox.wait_ready()?;
        }
        Ok(sandbox)
    }

    /// Like [`Sandbox::wait_ready`], but gives up at `deadline` with an
    /// error (dropping the sandbox then tears it down).
    pub fn wait_ready_until(&self, deadline: std::time::Instant) -> Result<()> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        if self.ready.get() {
            return Ok(());
        }
        {
            let slot = self.status.borrow();
            if let Some(status) = slot.as_ref() {
                if status.buffer().is_empty() {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    let t = Timespec {
                        tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                        tv_nsec: i64::from(left.subsec_nanos()),
                    };
                    let mut fds = [PollFd::new(status.get_ref(), PollFlags::IN)];
                    if matches!(poll(&mut fds, Some(&t)), Ok(0)) {
                        return Err(SandboxError::NotReadyInTime(self.name.clone()).into());
                    }
                }
            }
        }
        self.wait_ready()
    }

    /// Waits until the sandbox has finished setting up (at once if it has).
    pub fn wait_ready(&self) -> Result<()> {
        if self.ready.get() {
            return Ok(());
        }
        let mut slot = self.status.borrow_mut();
        let status = slot.as_mut().ok_or_else(|| Error::Protocol {
            name: self.name.clone(),
            why: "its status pipe is gone".into(),
        })?;
        match read_status(status, &self.name)? {
            Status::Ready(t) => {
                self.ready.set(true);
                self.ready_time_ns.set(t);
                drop(slot);
                self.write_evidence(t)
            }
            Status::Unshared => Err(SandboxError::UnexpectedStatus(self.name.clone()).into()),
        }
    }
}
