//! The client side of a native sandbox: start it, run commands in it, stop it.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::pipe::{pipe_with, PipeFlags};
use rustix::process::{Pid, Signal, WaitOptions};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, IoContext, Result};
use crate::evidence::{self, Evidence, ImageRef};
use crate::idmap;
use crate::protocol::{self, Event, ExecRequest, ProtocolError, Request};
use crate::runtime::{self, State};
use crate::spec::{validate_name, SandboxSpec, Writable};
use crate::supervisor::{self, Launch, CONTROL_SOCKET, SUPERVISOR_ARG};
use crate::transfer;

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

/// What a sandbox used so far, as the mechanisms that enforce its limits
/// see it (see [`crate::limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// CPU time of all its processes, in nanoseconds.
    pub cpu_ns: Option<u64>,
    /// The most memory it held at once since it started or since
    /// [`Sandbox::reset_memory_peak`], in bytes (the cgroup's peak, or the
    /// watchdog's sampled one).
    pub memory_peak: Option<u64>,
    /// Processes killed for going over the memory limit (by the kernel's
    /// OOM killer in a cgroup, or by the watchdog).
    pub oom_kills: u64,
    /// How many times the watchdog started a new peak on request.
    #[serde(default)]
    pub peak_resets: u64,
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
    /// How its limits are enforced.
    limits: crate::limits::Enforcement,
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
        ("error", msg) => Err(Error::Setup(msg.to_string())),
        _ => Err(Error::Setup(format!(
            "sandbox {name}: the supervisor exited during setup"
        ))),
    }
}

/// An exec with a pty: relay between the caller's terminal and `master`,
/// then [`TtyExec::wait`].
#[derive(Debug)]
pub struct TtyExec {
    pub master: OwnedFd,
    conn: UnixStream,
}

impl TtyExec {
    /// Waits for the command to end.
    pub fn wait(self, name: &str) -> Result<ExecStatus> {
        wait_exit(&self.conn, name).map(|(st, _)| st)
    }
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
        validate_name(&spec.name)?;
        let root = runtime::root()?;
        if let Err(e) = runtime::reap_dead(&root) {
            tracing::warn!("could not clean up dead sandboxes: {e}");
        }
        let dir = runtime::sandbox_dir(&root, &spec.name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::BadInput {
                    what: format!("sandbox name {:?}", spec.name),
                    why: "a sandbox of that name is running".into(),
                    fix: "choose another --name, or stop it first".into(),
                })
            }
            Err(e) => return Err(Error::io(format!("creating {}", dir.display()), e)),
        }
        let mut guard = DirGuard(Some(dir.clone()));
        std::fs::create_dir(dir.join("m")).ctx(|| format!("creating {}/m", dir.display()))?;
        if let Writable::Overlay { dir: o } = &spec.writable {
            // DIR is the caller's alone (0700): what the sandbox writes in
            // upper/ (a setuid-root file, under host root) must be out of
            // other users' reach. upper/ keeps the mode it is made with:
            // the overlay's root takes it, and it is the sandbox's `/`.
            let bad = |why: String| Error::BadInput {
                what: format!("--overlay {}", o.display()),
                why,
                fix: "pass a directory of your own on a local file system".into(),
            };
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(o)
                .map_err(|e| bad(format!("cannot create it: {e}")))?;
            let top = rustix::fs::open(
                o,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| bad(format!("cannot open it: {e}")))?;
            let st = rustix::fs::fstat(&top).map_err(|e| bad(format!("cannot stat it: {e}")))?;
            if st.st_uid != rustix::process::geteuid().as_raw() {
                return Err(bad(format!(
                    "it belongs to uid {}, who could run what the sandbox writes there",
                    st.st_uid
                )));
            }
            if st.st_mode & 0o077 != 0 {
                rustix::fs::fchmod(&top, rustix::fs::Mode::from_raw_mode(0o700))
                    .map_err(|e| bad(format!("cannot make it private (0700): {e}")))?;
                tracing::debug!(
                    "--overlay {}: mode {:04o} made 0700",
                    o.display(),
                    st.st_mode & 0o7777
                );
            }
            for (sub, mode) in [("upper", 0o777), ("work", 0o700)] {
                match rustix::fs::mkdirat(&top, sub, rustix::fs::Mode::from_raw_mode(mode)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(bad(format!("cannot create {sub}/ in it: {e}"))),
                }
            }
        }
        if let Writable::Disk { size_mib, scratch } = &spec.writable {
            let bad = |why: String, fix: &str| Error::BadInput {
                what: format!("a disk-backed writable layer of {size_mib} MiB"),
                why,
                fix: fix.into(),
            };
            if let Some(why) = crate::disk::unavailable() {
                return Err(bad(
                    why,
                    "leave out --disk (the layer is then a tmpfs: --tmpfs-size)",
                ));
            }
            if *size_mib < 16 {
                return Err(bad(
                    "ext4 needs at least 16 MiB".into(),
                    "pass a larger size, e.g. --disk 10g",
                ));
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
        let launch = Launch {
            spec,
            dir: dir.clone(),
            oneshot: opts.oneshot,
            client_pid: i32::try_from(std::process::id()).unwrap_or_default(),
            limits,
        };
        let Launched {
            pid,
            control,
            status,
            listening,
        } = launch_supervisor(&launch, opts)?;
        let mut control = File::from(control);
        let mut status = BufReader::new(File::from(status));
        let sandbox = Sandbox {
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
            evidence: evidence_path.clone(),
            image: image.reference.clone(),
            limits: launch.limits.clone(),
        };
        runtime::write_state(&dir, &state)?;
        if spec.ids.external {
            match read_status(&mut status, &sandbox.name)? {
                Status::Unshared => {
                    let caller = idmap::Caller::current();
                    if let Err(e) = idmap::write_external(pid, &spec.ids, &caller) {
                        let _ = send_line(&mut control, "abort");
                        return Err(e);
                    }
                    send_line(&mut control, "mapped")?;
                }
                Status::Ready(_) => {
                    return Err(Error::Setup(format!(
                        "sandbox {}: ready before its id maps were written",
                        sandbox.name
                    )))
                }
            }
        }
        drop(control);
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
                        return Err(Error::Setup(format!(
                            "sandbox {} was not ready in time; it was removed (raise --ready-timeout?)",
                            self.name
                        )));
                    }
                }
            }
        }
        self.wait_ready()
    }

    /// A round trip through the control socket.
    pub fn ping(&self) -> Result<()> {
        self.request(&Request::Ping, &[]).map(drop)
    }

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
            Status::Unshared => Err(Error::Setup(format!(
                "sandbox {}: unexpected status from its supervisor",
                self.name
            ))),
        }
    }

    /// Opens a running sandbox by name (started by another process) to run
    /// commands in it or copy files; a one-shot `run` is refused.
    pub fn attach(name: &str) -> Result<Sandbox> {
        Sandbox::attach_inner(name, false)
    }

    /// Opens a running sandbox by name to stop it; one-shot runs included.
    pub fn attach_to_stop(name: &str) -> Result<Sandbox> {
        Sandbox::attach_inner(name, true)
    }

    fn attach_inner(name: &str, any: bool) -> Result<Sandbox> {
        validate_name(name)?;
        let root = runtime::root()?;
        let dir = runtime::sandbox_dir(&root, name);
        let not_running = |why: &str| {
            Error::BadInput {
            what: format!("sandbox {name:?}"),
            why: why.into(),
            fix: "start it with `sifbox start --name NAME IMAGE`; `sifbox ps` lists running sandboxes".into(),
        }
        };
        let state =
            runtime::read_state(&dir).ok_or_else(|| not_running("no such sandbox is running"))?;
        if !runtime::is_alive(&state) {
            return Err(not_running("it has stopped (its supervisor is gone)"));
        }
        if state.oneshot && !any {
            return Err(Error::BadInput {
                what: format!("sandbox {name:?}"),
                why: "it belongs to a one-shot `sifbox run`, which ends with its command".into(),
                fix: "use `sifbox start --name NAME IMAGE` for a sandbox to exec into".into(),
            });
        }
        let pid = Pid::from_raw(state.supervisor_pid).ok_or_else(|| not_running("bad state"))?;
        Ok(Sandbox {
            name: name.to_string(),
            dir,
            supervisor: Some(pid),
            status: RefCell::new(None),
            ready: Cell::new(true),
            ready_time_ns: Cell::new(0),
            is_child: false,
            evidence: RefCell::new(match state.evidence {
                Some(p) => Evidencing::Written(p),
                None => Evidencing::None,
            }),
            stop_inside_ns: Cell::new(0),
            stopping: Cell::new(false),
            limits: state.limits,
        })
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

    /// Where this sandbox's sandbox.json is, once written.
    pub fn evidence_path(&self) -> Option<PathBuf> {
        match &*self.evidence.borrow() {
            Evidencing::Written(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Lets the sandbox run on after this handle is gone (`sifbox start`).
    pub fn detach(mut self) {
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

    /// Runs a command with `stdin` as its input and captures its output,
    /// keeping the last `max_output` bytes of each stream.
    pub fn exec_capture(
        &self,
        req: ExecRequest,
        stdin: Option<BorrowedFd<'_>>,
        max_output: usize,
    ) -> Result<ExecOutput> {
        let started = std::time::Instant::now();
        let kills_before = self.oom_kills_now();
        let (out_r, out_w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let (err_r, err_w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let null = File::open("/dev/null").ctx(|| "opening /dev/null".into())?;
        let input = stdin.unwrap_or(null.as_fd());
        let conn = self.connect()?;
        let last = req.stop_after;
        protocol::send(
            &conn,
            &Request::Exec(ExecRequest { tty: false, ..req }),
            &[input, out_w.as_fd(), err_w.as_fd()],
        )
        .map_err(|e| self.proto(e))?;
        drop((out_w, err_w));
        // Output is read until the command has exited and what it wrote is
        // drained: a background process that keeps the pipes open (a
        // server started with `&`) must not hold the caller.
        let (stop_r, stop_w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let reader = std::thread::spawn(move || read_until_exit(out_r, err_r, stop_r, max_output));
        let ended = self
            .wait_ready()
            .and_then(|()| wait_exit(&conn, &self.name));
        drop(stop_w);
        let ((stdout, out_cut), (stderr, err_cut)) = reader.join().unwrap_or_default();
        let (status, t) = self.over_memory(ended, kills_before)?;
        self.note_last(last, t);
        Ok(ExecOutput::new(
            status,
            (stdout, out_cut),
            (stderr, err_cut),
            started.elapsed(),
        ))
    }

    /// Starts a command that runs on after this call; its output and exit
    /// status go to files under the runtime dir (`execs/ID/`). Returns the id.
    pub fn exec_detached(&self, req: ExecRequest) -> Result<String> {
        let id = random_id();
        let dir = self.dir.join("execs").join(&id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .ctx(|| format!("creating {}", dir.display()))?;
        let create = |n: &str| {
            std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(dir.join(n))
                .ctx(|| format!("creating {}/{n}", dir.display()))
        };
        let (out, err, status) = (create("stdout")?, create("stderr")?, create("status.json")?);
        let null = File::open("/dev/null").ctx(|| "opening /dev/null".into())?;
        let conn = self.connect()?;
        protocol::send(
            &conn,
            &Request::Exec(ExecRequest {
                tty: false,
                detach_id: Some(id.clone()),
                ..req
            }),
            &[null.as_fd(), out.as_fd(), err.as_fd(), status.as_fd()],
        )
        .map_err(|e| self.proto(e))?;
        Ok(id)
    }

    /// The files of a detached exec: (stdout, stderr, status.json).
    pub fn detached_files(&self, id: &str) -> Result<(PathBuf, PathBuf, PathBuf)> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(Error::BadInput {
                what: format!("exec id {id:?}"),
                why: "not an id that `sifbox exec --detach` prints".into(),
                fix: "pass the id printed by `sifbox exec --detach`".into(),
            });
        }
        let dir = self.dir.join("execs").join(id);
        if !dir.is_dir() {
            return Err(Error::BadInput {
                what: format!("exec {id} of sandbox {}", self.name),
                why: "no such detached exec".into(),
                fix: "pass the id printed by `sifbox exec --detach`".into(),
            });
        }
        Ok((
            dir.join("stdout"),
            dir.join("stderr"),
            dir.join("status.json"),
        ))
    }

    /// The status of a detached exec, if it has ended.
    pub fn detached_status(&self, id: &str) -> Result<Option<ExecStatus>> {
        let (_, _, status) = self.detached_files(id)?;
        let text = std::fs::read(&status).ctx(|| format!("reading {}", status.display()))?;
        if text.is_empty() {
            return Ok(None);
        }
        let ev: Event = serde_json::from_slice(&text).map_err(|e| Error::Protocol {
            name: self.name.clone(),
            why: format!("malformed {}: {e}", status.display()),
        })?;
        Ok(ExecStatus::from_event(ev))
    }

    /// Waits for a detached exec to end.
    pub fn wait_detached(&self, id: &str) -> Result<ExecStatus> {
        loop {
            if let Some(st) = self.detached_status(id)? {
                return Ok(st);
            }
            if !self.is_running() {
                return Err(Error::Protocol {
                    name: self.name.clone(),
                    why: format!("the sandbox stopped before exec {id} ended"),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Sends `signal` to a detached exec (SIGKILL: to every process it started).
    pub fn signal_detached(&self, id: &str, signal: i32) -> Result<()> {
        self.detached_files(id)?;
        self.request(
            &Request::Signal {
                exec_id: id.to_string(),
                signal,
            },
            &[],
        )
        .map(drop)
    }

    /// Whether the sandbox's supervisor still runs.
    pub fn is_running(&self) -> bool {
        self.supervisor
            .is_some_and(|p| runtime::process_start_time(p.as_raw_nonzero().get()).is_some())
    }

    /// Copies `src` on the host into the sandbox at `dst` (`docker cp`
    /// rules: into `dst` when it is a directory, else as `dst`). With
    /// `owner` (a user of the image) the copy belongs to that user.
    pub fn upload(&self, src: &Path, dst: &str, owner: Option<&str>) -> Result<()> {
        let name = base_name(src)?;
        let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let conn = self.connect()?;
        protocol::send(
            &conn,
            &Request::Upload {
                dst: dst.to_string(),
                name: name.clone(),
                owner: owner.map(str::to_string),
            },
            &[r.as_fd()],
        )
        .map_err(|e| self.proto(e))?;
        drop(r);
        let src_owned = src.to_path_buf();
        let writer =
            std::thread::spawn(move || transfer::write_tar(&src_owned, &name, File::from(w)));
        let reply = self.reply(&conn);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("writer panicked")));
        reply?;
        written.ctx(|| format!("reading {}", src.display()))
    }

    /// Copies `src` in the sandbox to `dst` on the host (`docker cp` rules),
    /// setuid and setgid bits dropped: the stream is the sandbox's and is
    /// unpacked as hostile (see [`transfer`]).
    pub fn download(&self, src: &str, dst: &Path) -> Result<()> {
        self.download_with(src, dst, transfer::SetId::Strip)
    }

    /// [`Sandbox::download`], keeping setuid and setgid bits with
    /// `SetId::Keep`: only for a copy that no one else can reach, as a
    /// sandbox can plant a setuid file that runs as the caller.
    pub fn download_with(&self, src: &str, dst: &Path, setid: transfer::SetId) -> Result<()> {
        let name = Path::new(src)
            .file_name()
            .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned());
        let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let conn = self.connect()?;
        protocol::send(
            &conn,
            &Request::Download {
                path: src.to_string(),
            },
            &[w.as_fd()],
        )
        .map_err(|e| self.proto(e))?;
        drop(w);
        let dst_owned = dst.to_path_buf();
        let reader = std::thread::spawn(move || {
            transfer::unpack_to_host(File::from(r), &dst_owned, &name, setid)
        });
        let reply = self.reply(&conn);
        let unpacked = reader
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("reader panicked")));
        reply?;
        unpacked.ctx(|| format!("writing {}", dst.display()))
    }

    /// Unpacks a tar stream of relative names into the directory `dst` in
    /// the sandbox (made with its parents when missing), confined to it:
    /// `write` gets the pipe to write the stream to. Entries belong to
    /// `owner` (numeric ids inside) when given, else to root.
    pub fn extract<F>(&self, dst: &str, owner: Option<(u32, u32)>, write: F) -> Result<()>
    where
        F: FnOnce(File) -> std::io::Result<()> + Send + 'static,
    {
        let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let conn = self.connect()?;
        protocol::send(
            &conn,
            &Request::Extract {
                dst: dst.to_string(),
                owner,
            },
            &[r.as_fd()],
        )
        .map_err(|e| self.proto(e))?;
        drop(r);
        let writer = std::thread::spawn(move || write(File::from(w)));
        let reply = self.reply(&conn);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("writer panicked")));
        reply?;
        written.ctx(|| format!("writing the archive for {dst}"))
    }

    /// Streams a tar of the sandbox's whole root file system (owners as seen
    /// inside, other mounts left out) to `read`, which gets the pipe's
    /// reading end, and returns what it returns.
    pub fn snapshot<T, F>(&self, read: F) -> Result<T>
    where
        F: FnOnce(File) -> std::io::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let conn = self.connect()?;
        protocol::send(&conn, &Request::Snapshot, &[w.as_fd()]).map_err(|e| self.proto(e))?;
        drop(w);
        let reader = std::thread::spawn(move || read(File::from(r)));
        let reply = self.reply(&conn);
        let got = reader
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("reader panicked")));
        reply?;
        got.ctx(|| "reading the sandbox's root file system".to_string())
    }

    /// Gives the copy of the root at `dst` the owners of the original (see
    /// [`Request::MirrorOwners`]).
    pub fn mirror_owners(&self, dst: &str) -> Result<()> {
        self.request(
            &Request::MirrorOwners {
                dst: dst.to_string(),
            },
            &[],
        )
        .map(drop)
    }

    /// Removes the tree at `path` inside the sandbox (see
    /// [`Request::Remove`]).
    pub fn remove(&self, path: &str) -> Result<()> {
        self.request(
            &Request::Remove {
                path: path.to_string(),
            },
            &[],
        )
        .map(drop)
    }

    /// Gives `path` inside the sandbox (not followed) to `user` of the
    /// image (see [`Request::Chown`]).
    pub fn chown(&self, path: &str, user: &str) -> Result<()> {
        self.request(
            &Request::Chown {
                path: path.to_string(),
                user: user.to_string(),
            },
            &[],
        )
        .map(drop)
    }

    /// Sends one request and waits for its `ok` (or error).
    fn request(&self, req: &Request, fds: &[BorrowedFd<'_>]) -> Result<u64> {
        let conn = self.connect()?;
        protocol::send(&conn, req, fds).map_err(|e| self.proto(e))?;
        self.reply(&conn)
    }

    fn reply(&self, conn: &UnixStream) -> Result<u64> {
        match protocol::recv::<Event>(conn) {
            Ok((Event::Ok { time_ns }, _)) => Ok(time_ns),
            Ok((Event::Error { message, .. }, _)) => {
                Err(Error::Setup(format!("sandbox {}: {message}", self.name)))
            }
            Ok((other, _)) => Err(self.proto(ProtocolError::Io(std::io::Error::other(format!(
                "unexpected {other:?}"
            ))))),
            Err(e) => Err(self.proto(e)),
        }
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

    /// Runs a command with the given stdin, stdout and stderr and waits for it.
    /// With `stop_after`, the sandbox stops by itself once the command ended.
    pub fn exec(&self, req: ExecRequest, stdio: [BorrowedFd<'_>; 3]) -> Result<ExecStatus> {
        let kills_before = self.oom_kills_now();
        let conn = self.connect()?;
        let last = req.stop_after;
        protocol::send(
            &conn,
            &Request::Exec(ExecRequest { tty: false, ..req }),
            &stdio,
        )
        .map_err(|e| self.proto(e))?;
        self.wait_ready()?;
        let (status, t) = self.over_memory(wait_exit(&conn, &self.name), kills_before)?;
        self.note_last(last, t);
        Ok(status)
    }

    /// With a memory limit, the kills for it so far (to tell whether an
    /// exec's end was one).
    fn oom_kills_now(&self) -> Option<u64> {
        self.limits
            .applied
            .iter()
            .any(|a| a.limit == "memory")
            .then(|| self.usage().oom_kills)
    }

    /// An exec's end, read for a memory limit at work: a command killed
    /// (or a sandbox that went) while the limit's killer acted is said to
    /// have gone over it, with Docker's exit code 137. `before`: the kills
    /// when the exec started.
    fn over_memory(
        &self,
        ended: Result<(ExecStatus, u64)>,
        before: Option<u64>,
    ) -> Result<(ExecStatus, u64)> {
        let limit = self.limits.applied.iter().find(|a| a.limit == "memory");
        let killed = matches!(
            &ended,
            Ok((ExecStatus::Exited { code: 137, .. }, _)) | Err(Error::Protocol { .. })
        );
        let Some(limit) = limit.filter(|_| killed) else {
            return ended;
        };
        let mut kills = self.usage().oom_kills;
        if ended.is_err() {
            // Gone, runtime dir and all: outer's last status line says.
            kills = kills.max(self.final_oom_kills());
        }
        if kills <= before.unwrap_or(0) {
            return ended;
        }
        tracing::warn!(
            "sandbox {} went over its memory limit of {} MiB: {} killed {}",
            self.name,
            limit.value >> 20,
            match limit.how {
                crate::limits::How::Watchdog => "sifbox's watchdog",
                _ => "the kernel's OOM killer",
            },
            if ended.is_err() {
                "the sandbox"
            } else {
                "its largest process"
            },
        );
        Ok(match ended {
            Ok(e) => e,
            Err(_) => (
                ExecStatus::Exited {
                    code: 137,
                    timed_out: false,
                },
                0,
            ),
        })
    }

    /// The memory-limit kills outer reports when it ends (its last status
    /// line), for a sandbox this handle started; waits for that line.
    fn final_oom_kills(&self) -> u64 {
        let mut slot = self.status.borrow_mut();
        let Some(status) = slot.as_mut() else {
            return 0;
        };
        let mut line = String::new();
        while status.read_line(&mut line).is_ok_and(|n| n > 0) {
            if let Some(n) = line
                .trim_end()
                .strip_prefix("exited 0 oom_kills=")
                .and_then(|n| n.parse().ok())
            {
                return n;
            }
            line.clear();
        }
        0
    }

    /// Runs a command on a new pty inside the sandbox.
    pub fn exec_tty(&self, req: ExecRequest) -> Result<std::result::Result<TtyExec, ExecStatus>> {
        let conn = self.connect()?;
        protocol::send(&conn, &Request::Exec(ExecRequest { tty: true, ..req }), &[])
            .map_err(|e| self.proto(e))?;
        self.wait_ready()?;
        let (ev, mut fds) = protocol::recv::<Event>(&conn).map_err(|e| self.proto(e))?;
        match ev {
            Event::Started { .. } => match fds.pop() {
                Some(master) => Ok(Ok(TtyExec { master, conn })),
                None => {
                    Err(self.proto(ProtocolError::Io(std::io::Error::other("no pty came back"))))
                }
            },
            Event::Error { code, message } => Ok(Err(ExecStatus::Failed { code, message })),
            other => Err(self.proto(ProtocolError::Io(std::io::Error::other(format!(
                "unexpected {other:?}"
            ))))),
        }
    }

    fn proto(&self, e: ProtocolError) -> Error {
        Error::Protocol {
            name: self.name.clone(),
            why: e.to_string(),
        }
    }

    /// Stops the sandbox: SIGTERM to every process, SIGKILL after `grace`;
    /// returns once no process, mount or runtime dir of it is left.
    pub fn stop(mut self, grace: std::time::Duration) -> Result<()> {
        self.shutdown(grace)
    }

    fn shutdown(&mut self, grace: std::time::Duration) -> Result<()> {
        let Some(pid) = self.supervisor.take() else {
            return Ok(());
        };
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let mut inside_ns = self.stop_inside_ns.get();
        if !self.stopping.get() {
            let asked = self.connect().ok().and_then(|c| {
                protocol::send(&c, &Request::Stop { grace_ms }, &[])
                    .ok()
                    .map(|()| c)
            });
            match asked {
                // The reply comes once every process had its grace time.
                Some(c) => {
                    if let Ok((Event::Ok { time_ns }, _)) = protocol::recv::<Event>(&c) {
                        inside_ns = time_ns;
                    }
                }
                None => {
                    let _ = rustix::process::kill_process(pid, Signal::TERM);
                }
            }
        }
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
        if let Some(path) = self.evidence_path() {
            // A record inside the runtime dir goes with it.
            if !path.starts_with(&self.dir) {
                Evidence::record_stop(&path, inside_ns)?;
            }
        }
        runtime::remove_dir(&self.dir)
    }

    /// Tells the supervisor to tear everything down now (used on SIGINT/SIGTERM).
    pub fn kill_handle(&self) -> Option<KillHandle> {
        self.supervisor.map(KillHandle)
    }
}

/// What a captured exec produced.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    pub timed_out: bool,
    /// Some output was dropped (only the tail was kept).
    pub truncated: bool,
    pub duration_ms: u64,
    /// Why the command could not start, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The last `max` bytes of a stream, and whether anything was dropped.
#[derive(Debug)]
pub(crate) struct Tail {
    kept: std::collections::VecDeque<u8>,
    max: usize,
    cut: bool,
}

impl Tail {
    pub(crate) fn new(max: usize) -> Tail {
        Tail {
            kept: std::collections::VecDeque::new(),
            max,
            cut: false,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.kept.extend(data);
        if self.kept.len() > self.max {
            let excess = self.kept.len() - self.max;
            self.kept.drain(..excess);
            self.cut = true;
        }
    }

    /// The kept bytes (lossy UTF-8) and whether any were dropped.
    pub(crate) fn finish(self) -> (String, bool) {
        let bytes: Vec<u8> = self.kept.into_iter().collect();
        (String::from_utf8_lossy(&bytes).into_owned(), self.cut)
    }
}

impl ExecOutput {
    /// The output of an exec that ended with `status`: each stream's kept
    /// tail and whether it was cut, and how long it took.
    pub(crate) fn new(
        status: ExecStatus,
        (stdout, out_cut): (String, bool),
        (stderr, err_cut): (String, bool),
        took: std::time::Duration,
    ) -> ExecOutput {
        ExecOutput {
            stdout,
            stderr,
            exit_code: status.code(),
            timed_out: status.timed_out(),
            truncated: out_cut || err_cut,
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            error: match status {
                ExecStatus::Failed { message, .. } => Some(message),
                ExecStatus::Exited { .. } => None,
            },
        }
    }
}

/// Reads stdout and stderr, keeping the last `max` bytes of each, until both
/// end, or until `stop` becomes readable (the command exited) and what is
/// buffered has been drained.
fn read_until_exit(
    out: OwnedFd,
    err: OwnedFd,
    stop: OwnedFd,
    max: usize,
) -> ((String, bool), (String, bool)) {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut tails = [Tail::new(max), Tail::new(max)];
    let mut open = [Some(out), Some(err)];
    let mut buf = vec![0u8; 65536];
    let mut draining = false;
    while open.iter().any(Option::is_some) {
        if !draining {
            let mut fds: Vec<PollFd<'_>> = open
                .iter()
                .flatten()
                .map(|fd| PollFd::new(fd, PollFlags::IN))
                .collect();
            fds.push(PollFd::new(&stop, PollFlags::IN));
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
            if fds.last().is_some_and(|f| !f.revents().is_empty()) {
                draining = true;
                for fd in open.iter().flatten() {
                    let _ = rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK);
                }
            }
        }
        for (slot, tail) in open.iter_mut().zip(tails.iter_mut()) {
            let Some(fd) = slot else { continue };
            let mut fds = [PollFd::new(&*fd, PollFlags::IN)];
            let ready = draining
                || matches!(poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0);
            if !ready {
                continue;
            }
            match rustix::io::read(&*fd, &mut buf) {
                Ok(0) => *slot = None,
                Ok(n) => tail.push(&buf[..n]),
                Err(rustix::io::Errno::INTR) => {}
                // Drained (EAGAIN) or broken: done with this stream.
                Err(_) => *slot = None,
            }
        }
    }
    let [out, err] = tails;
    (out.finish(), err.finish())
}

fn random_id() -> String {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        let n = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b.copy_from_slice(&n.to_le_bytes()[..8]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn base_name(p: &Path) -> Result<String> {
    let canon = std::fs::canonicalize(p).ctx(|| format!("{}", p.display()))?;
    Ok(canon
        .file_name()
        .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned()))
}

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

/// Plans how `spec`'s limits are enforced here and makes the sandbox's
/// cgroup when one enforces them; a cgroup that cannot be made leaves the
/// fallbacks (said in the record).
fn enforce_limits(spec: &SandboxSpec) -> Result<crate::limits::Enforcement> {
    use crate::limits::{self, cgroup::CgroupLimits};
    let host = limits::Host::detect();
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
        };
        match h.create(&spec.name, &cl) {
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
    Ok(e)
}

/// Starts the outer supervisor; returns its pid, the control pipe's write end
/// and the status pipe's read end.
///
/// A single-threaded client forks it directly (no exec: about a millisecond
/// less per sandbox); a multi-threaded one (an async runtime) must re-execute
/// the sifbox binary so that the supervisor starts single-threaded.
fn launch_supervisor(launch: &Launch, opts: &StartOptions) -> Result<Launched> {
    if opts.fork_when_possible && sifbox_sys::thread_count().ok() == Some(1) {
        let (control_r, control_w) =
            pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let (status_r, status_w) =
            pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        // Made here, so that requests can be queued while the sandbox sets
        // itself up; the supervisor inherits it.
        let listener = bind_control_socket(&launch.dir)?;
        match sifbox_sys::fork()? {
            sifbox_sys::Forked::Child => {
                drop((control_w, status_r));
                exit_now(supervisor::main_forked(
                    launch, control_r, status_w, listener,
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
    let mut child = Command::new(&opts.supervisor_exe)
        .arg0("sifbox")
        .arg(SUPERVISOR_ARG)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .ctx(|| format!("starting the supervisor {}", opts.supervisor_exe.display()))?;
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| Error::Setup("pid out of range".into()))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(Error::Setup("supervisor pipes missing".into()));
    };
    let mut control = File::from(OwnedFd::from(stdin));
    send_line(
        &mut control,
        &serde_json::to_string(launch).map_err(|e| Error::Setup(e.to_string()))?,
    )?;
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

/// Creates the control socket of the sandbox whose runtime dir is `dir`.
fn bind_control_socket(dir: &Path) -> Result<UnixListener> {
    use std::os::fd::AsRawFd;
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| Error::io(format!("opening {}", dir.display()), e))?;
    UnixListener::bind(format!(
        "/proc/self/fd/{}/{CONTROL_SOCKET}",
        fd.as_fd().as_raw_fd()
    ))
    .map_err(|e| Error::io(format!("creating {}/{CONTROL_SOCKET}", dir.display()), e))
}

#[allow(
    clippy::exit,
    reason = "a forked supervisor ends here, never returning into the client"
)]
fn exit_now(code: i32) -> ! {
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

fn wait_exit(conn: &UnixStream, name: &str) -> Result<(ExecStatus, u64)> {
    loop {
        match protocol::recv::<Event>(conn) {
            Ok((ev, _)) => {
                let t = match &ev {
                    Event::Exit { time_ns, .. } => *time_ns,
                    _ => 0,
                };
                if let Some(st) = ExecStatus::from_event(ev) {
                    return Ok((st, t));
                }
            }
            Err(ProtocolError::Closed) => {
                return Err(Error::Protocol {
                    name: name.to_string(),
                    why: "the command ended without an exit status: the sandbox stopped, or something in it killed the process that ran the command".into(),
                })
            }
            Err(e) => {
                return Err(Error::Protocol {
                    name: name.to_string(),
                    why: e.to_string(),
                })
            }
        }
    }
}
