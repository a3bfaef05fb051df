//! The client side of a native sandbox: start it, run commands in it, stop it.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::pipe::{pipe_with, PipeFlags};
use rustix::process::{Pid, Signal, WaitOptions};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, IoContext, Result};
use crate::idmap;
use crate::protocol::{self, Event, ExecRequest, ProtocolError, Request};
use crate::runtime::{self, State};
use crate::spec::{validate_name, SandboxSpec, Writable};
use crate::supervisor::{self, Launch, CONTROL_SOCKET, SUPERVISOR_ARG};

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
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecStatus {
    /// The command ran and ended with this code (128+N for signal N).
    Exited(i32),
    /// The command could not start: 125 (sifbox), 126 (not executable) or
    /// 127 (not found), with the reason.
    Failed { code: i32, message: String },
}

impl ExecStatus {
    /// The exit code under the contract of `sifbox run`.
    pub fn code(&self) -> i32 {
        match self {
            ExecStatus::Exited(c) | ExecStatus::Failed { code: c, .. } => *c,
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
    /// The sandbox's last exec has run: it is stopping by itself.
    stopping: Cell<bool>,
}

/// A status line of the supervisor that is not an error.
enum Status {
    Unshared,
    Ready,
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
        ("ready", _) => Ok(Status::Ready),
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
        wait_exit(&self.conn, name)
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
            for sub in ["upper", "work"] {
                std::fs::create_dir_all(o.join(sub)).map_err(|e| Error::BadInput {
                    what: format!("--overlay {}", o.display()),
                    why: format!("cannot create {sub}/ in it: {e}"),
                    fix: "pass a writable directory on a local file system".into(),
                })?;
            }
        }

        let launch = Launch {
            spec,
            dir: dir.clone(),
            oneshot: opts.oneshot,
            client_pid: i32::try_from(std::process::id()).unwrap_or_default(),
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
            stopping: Cell::new(false),
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
                Status::Ready => {
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
            Status::Ready => {
                self.ready.set(true);
                Ok(())
            }
            Status::Unshared => Err(Error::Setup(format!(
                "sandbox {}: unexpected status from its supervisor",
                self.name
            ))),
        }
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
        connect(&self.dir).map_err(|e| Error::Protocol {
            name: self.name.clone(),
            why: format!("cannot reach its control socket: {e}"),
        })
    }

    /// Runs a command with the given stdin, stdout and stderr and waits for it.
    /// With `stop_after`, the sandbox stops by itself once the command ended.
    pub fn exec(&self, req: ExecRequest, stdio: [BorrowedFd<'_>; 3]) -> Result<ExecStatus> {
        let conn = self.connect()?;
        let last = req.stop_after;
        protocol::send(
            &conn,
            &Request::Exec(ExecRequest { tty: false, ..req }),
            &stdio,
        )
        .map_err(|e| self.proto(e))?;
        self.wait_ready()?;
        let status = wait_exit(&conn, &self.name)?;
        self.stopping.set(last);
        Ok(status)
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
        let asked = if self.stopping.get() {
            None
        } else {
            let asked = self.connect().ok().and_then(|c| {
                protocol::send(&c, &Request::Stop { grace_ms }, &[])
                    .ok()
                    .map(|()| c)
            });
            if asked.is_none() {
                let _ = rustix::process::kill_process(pid, Signal::TERM);
            }
            asked
        };
        loop {
            match rustix::process::waitpid(Some(pid), WaitOptions::empty()) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Error::io(format!("waiting for sandbox {}", self.name), e)),
                Ok(_) => break,
            }
        }
        drop(asked);
        runtime::remove_dir(&self.dir)
    }

    /// Tells the supervisor to tear everything down now (used on SIGINT/SIGTERM).
    pub fn kill_handle(&self) -> Option<KillHandle> {
        self.supervisor.map(KillHandle)
    }
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

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(std::time::Duration::ZERO) {
            tracing::warn!("cleaning up sandbox {}: {e}", self.name);
        }
    }
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
/// (through /proc/self/fd, so long paths do not hit the 108-byte limit).
pub fn connect(dir: &Path) -> std::io::Result<UnixStream> {
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

fn wait_exit(conn: &UnixStream, name: &str) -> Result<ExecStatus> {
    loop {
        match protocol::recv::<Event>(conn) {
            Ok((Event::Started { .. }, _)) | Ok((Event::Ok, _)) => {}
            Ok((Event::Exit { code }, _)) => return Ok(ExecStatus::Exited(code)),
            Ok((Event::Error { code, message }, _)) => {
                return Ok(ExecStatus::Failed { code, message })
            }
            Err(ProtocolError::Closed) => {
                return Err(Error::Protocol {
                    name: name.to_string(),
                    why: "the sandbox stopped while the command ran".into(),
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
