//! The tokio API of the native engine: [`AsyncSandbox`], [`Process`],
//! [`list`] and [`gc`].
//!
//! This is the interface an agent harness uses for every rollout: start a
//! sandbox, run commands in it (captured, with a timeout that kills every
//! process the command started), keep a long-lived process and talk to it
//! line by line (newline-delimited JSON-RPC agents), copy files in and out,
//! stop it.
//!
//! ```no_run
//! use std::time::Duration;
//! use sifbox_engine::aio::{self, AsyncSandbox};
//! use sifbox_engine::StartOptions;
//!
//! # async fn demo() -> sifbox_engine::Result<()> {
//! let spec = aio::default_spec("rollout-17", "/images/python-3.12")?;
//! let sb = AsyncSandbox::start(spec, StartOptions::new("/usr/bin/sifbox".into())).await?;
//!
//! let out = sb
//!     .command("sh")
//!     .args(["-c", "echo $GREETING from $(hostname)"])
//!     .env("GREETING", "hello")
//!     .timeout(Duration::from_secs(30))
//!     .output()
//!     .await?;
//! assert_eq!(out.exit_code, 0);
//! print!("{}", out.stdout);
//!
//! let mut agent = sb.command("cat").spawn().await?;
//! agent.writeline(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).await?;
//! let reply = agent.readline().await?;
//! agent.kill().await?;
//!
//! sb.stop(Duration::from_secs(5)).await?;
//! # let _ = reply;
//! # Ok(())
//! # }
//! ```
//!
//! # Design
//!
//! - **Handles.** [`Sandbox`] (the sync client) is `Send` but not `Sync`, and
//!   every request it makes opens its own connection to the sandbox's control
//!   socket. [`AsyncSandbox`] therefore keeps the `Sandbox` that owns the
//!   sandbox's lifetime behind an `Arc<Mutex<..>>`, locked only for a moment
//!   (stop, detach, the base environment), and never holds that lock while a
//!   command runs: execs and processes talk to the control socket directly,
//!   transfers use a short-lived attached `Sandbox` on a blocking thread. So
//!   clones of one handle run any number of commands concurrently (the
//!   supervisor forks one process per exec). A dedicated thread per sandbox
//!   was the alternative; it would serialize everything through one queue.
//! - **Execs are native async.** A command's stdio are pipes made here (the
//!   far ends travel to the sandbox with the request as SCM_RIGHTS, our ends
//!   become [`tokio::net::unix::pipe`] handles) and its events are read from
//!   the control connection without a thread per command.
//! - **Cancellation kills.** The supervisor watches the connection of an
//!   attached exec: when the client goes away while the command runs, every
//!   process the exec started is killed (the exec process is a child
//!   subreaper, so that includes processes that called `setsid` or
//!   daemonized). Dropping an [`AsyncSandbox::exec`] future (say, under
//!   `tokio::time::timeout`) or a [`Process`] therefore leaves nothing
//!   running.
//! - **`kill()`.** A spawned process is an attached exec that also carries an
//!   exec id (`detach_id`, sent with three stdio descriptors instead of the
//!   fourth status descriptor of a detached exec): the supervisor registers
//!   it for [`Request::Signal`] while the connection still carries its
//!   events. [`Process::kill`] sends SIGKILL by id, which reaches every
//!   process below the exec's subreaper, and repeats until the supervisor
//!   no longer knows the id, i.e. until the exec's subreaper has been reaped
//!   after every process of the exec was gone. So when `kill()` returns,
//!   nothing of that exec is left, including processes the command left
//!   behind after it ended.
//! - **Secrets.** Environment values travel only inside the exec request on
//!   the control socket (a private Unix socket in the private runtime dir),
//!   never in an argv; the base environment is the sandbox's 0600 `env.json`.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::pipe::{pipe_with, PipeFlags};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;

use crate::error::{Error, IoContext, Result};
use crate::idmap;
use crate::protocol::{self, Event, ExecRequest, ProtocolError, Request};
use crate::runtime;
use crate::sandbox::{self, ExecOutput, ExecStatus, Sandbox, StartOptions, Tail};
use crate::spec::{self, NetMode, SandboxSpec, UsernsMode, Writable};

/// Captured output is limited to this much per stream unless asked otherwise
/// (the tail is kept).
pub const DEFAULT_MAX_OUTPUT: usize = 16 << 20;

/// How long [`AsyncSandbox::start`] waits for the sandbox to be ready.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`Process::kill`] waits for the last process of an exec to go.
const KILL_LIMIT: Duration = Duration::from_secs(10);

/// SIGKILL.
const SIGKILL: i32 = 9;

/// A description of a sandbox with the defaults of `sifbox start`: `rootfs`
/// (an unpacked root file system directory) as the read-only image under a
/// 1 GiB tmpfs for writes, host networking with the host's resolv.conf and
/// hosts, `--userns auto`, the name as host name, no binds. Change the
/// fields of the result for anything else.
///
/// ```no_run
/// # fn demo() -> sifbox_engine::Result<()> {
/// let mut spec = sifbox_engine::aio::default_spec("job-1", "/images/ubuntu")?;
/// spec.net = sifbox_engine::spec::NetMode::None;
/// # Ok(())
/// # }
/// ```
pub fn default_spec(name: &str, rootfs: impl AsRef<Path>) -> Result<SandboxSpec> {
    spec::validate_name(name)?;
    let given = rootfs.as_ref();
    let bad = |why: String| Error::BadInput {
        what: format!("root file system {}", given.display()),
        why,
        fix: "pass an unpacked root file system directory".into(),
    };
    let rootfs = std::fs::canonicalize(given).map_err(|e| bad(e.to_string()))?;
    if !rootfs.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let ids = idmap::resolve(UsernsMode::Auto, &idmap::Caller::current())?;
    Ok(SandboxSpec {
        name: name.to_string(),
        rootfs,
        layers: Vec::new(),
        // Names are ASCII, so any byte is a char boundary.
        hostname: name[..name.len().min(64)].to_string(),
        net: NetMode::Host,
        ids,
        writable: Writable::Tmpfs {
            size_mib: spec::DEFAULT_TMPFS_MIB,
        },
        binds: Vec::new(),
        host_dns: true,
        shm_bytes: spec::DEFAULT_SHM_BYTES,
        confinement: spec::Confinement::default(),
        limits: spec::Limits {
            pids: Some(spec::DEFAULT_PIDS),
            ..spec::Limits::default()
        },
    })
}

/// A running sandbox, for tokio.
///
/// Cheap to clone; clones share one sandbox and may be used concurrently
/// (see the module's design notes). A sandbox this handle started is
/// stopped when the last clone goes, unless [`AsyncSandbox::detach`] was
/// called; that drop stops it synchronously (a few milliseconds, with no
/// grace time), so prefer an explicit [`AsyncSandbox::stop`]. One found by
/// [`AsyncSandbox::attach`] runs on.
#[derive(Debug, Clone)]
pub struct AsyncSandbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    dir: PathBuf,
    supervisor_pid: Option<i32>,
    evidence: Option<PathBuf>,
    /// The sync handle that owns the sandbox's lifetime; `None` once stopped
    /// or detached. Locked only briefly, never across an exec.
    handle: Mutex<Option<Sandbox>>,
}

/// Where a command's stdin, stdout or stderr goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stdio {
    /// A pipe to this process ([`Process::stdin`], [`Process::stdout`],
    /// [`Process::stderr`]).
    #[default]
    Piped,
    /// `/dev/null`.
    Null,
    /// This process's own stdin, stdout or stderr.
    Inherit,
}

/// The stdio of a spawned command. A piped stream must be read (or
/// written): a command blocks once a pipe's buffer (64 KiB) is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpawnStdio {
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
}

/// A sandbox as [`list`] finds it in the runtime dir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub name: String,
    /// Its supervisor runs (else it is dead and [`gc`] removes it).
    pub running: bool,
    /// Host pid of the outer supervisor.
    pub supervisor_pid: Option<i32>,
    /// Unix seconds.
    pub created: Option<u64>,
    /// The image as the caller named it.
    pub image: Option<String>,
    pub rootfs: Option<PathBuf>,
    /// Where its sandbox.json is.
    pub evidence: Option<PathBuf>,
    /// Its runtime dir.
    pub dir: PathBuf,
}

impl From<runtime::Entry> for SandboxInfo {
    fn from(e: runtime::Entry) -> SandboxInfo {
        let s = e.state.as_ref();
        SandboxInfo {
            supervisor_pid: s.map(|s| s.supervisor_pid),
            created: s.map(|s| s.created),
            image: s.map(|s| s.image.clone()),
            rootfs: s.map(|s| s.rootfs.clone()),
            evidence: s.and_then(|s| s.evidence.clone()),
            name: e.name,
            running: e.alive,
            dir: e.dir,
        }
    }
}

/// The sandboxes of this user on this node (`sifbox ps`), running or dead.
///
/// ```no_run
/// # async fn demo() -> sifbox_engine::Result<()> {
/// for sb in sifbox_engine::aio::list().await? {
///     println!("{} {}", sb.name, if sb.running { "running" } else { "dead" });
/// }
/// # Ok(())
/// # }
/// ```
pub async fn list() -> Result<Vec<SandboxInfo>> {
    blocking("listing sandboxes", || {
        let root = runtime::root()?;
        Ok(runtime::scan(&root)?
            .into_iter()
            .map(SandboxInfo::from)
            .collect())
    })
    .await
}

/// Removes what dead sandboxes (whose supervisor was killed, or whose node
/// crashed) left in the runtime dir (`sifbox gc`); returns their names.
/// Their processes and mounts went with their supervisor.
///
/// ```no_run
/// # async fn demo() -> sifbox_engine::Result<()> {
/// let removed = sifbox_engine::aio::gc().await?;
/// println!("removed {removed:?}");
/// # Ok(())
/// # }
/// ```
pub async fn gc() -> Result<Vec<String>> {
    blocking("cleaning up dead sandboxes", || {
        runtime::reap_dead(&runtime::root()?)
    })
    .await
}

impl AsyncSandbox {
    /// Starts a sandbox and returns once it is ready (a round trip through
    /// its control socket passed), or fails after [`DEFAULT_READY_TIMEOUT`]
    /// having removed everything it made.
    ///
    /// `opts.supervisor_exe` is the sifbox binary: from a tokio runtime
    /// (a multi-threaded process) the supervisor is always started as
    /// `sifbox __supervisor`. `opts.oneshot` is refused: its parent-death
    /// signal would follow the blocking-pool thread that started the
    /// sandbox, which tokio ends when idle.
    ///
    /// ```no_run
    /// use sifbox_engine::{aio, aio::AsyncSandbox, StartOptions};
    /// # async fn demo() -> sifbox_engine::Result<()> {
    /// let spec = aio::default_spec("web-task-3", "/images/debian")?;
    /// let opts = StartOptions::new("/usr/local/bin/sifbox".into());
    /// let sb = AsyncSandbox::start(spec, opts).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn start(spec: SandboxSpec, opts: StartOptions) -> Result<AsyncSandbox> {
        AsyncSandbox::start_with_timeout(spec, opts, DEFAULT_READY_TIMEOUT).await
    }

    /// [`AsyncSandbox::start`] with another readiness timeout.
    pub async fn start_with_timeout(
        spec: SandboxSpec,
        opts: StartOptions,
        ready_timeout: Duration,
    ) -> Result<AsyncSandbox> {
        if opts.oneshot {
            return Err(Error::BadInput {
                what: "StartOptions::oneshot".into(),
                why: "an async client cannot tie a sandbox to its life (the parent-death signal follows the starting thread, and tokio ends idle blocking threads)".into(),
                fix: "leave oneshot false and stop the sandbox with AsyncSandbox::stop".into(),
            });
        }
        let name = spec.name.clone();
        let starting = tokio::task::spawn_blocking(move || {
            let sb = Sandbox::launch(spec, &opts)?;
            sb.wait_ready_until(Instant::now() + ready_timeout)?;
            sb.ping()?;
            Ok::<_, Error>(sb)
        });
        // A supervisor that was executed (not forked) is waited for inside
        // launch() without a deadline; this one covers it too. A start
        // abandoned here is stopped when its thread returns the handle.
        match tokio::time::timeout(ready_timeout + Duration::from_secs(1), starting).await {
            Ok(joined) => Ok(AsyncSandbox::wrap(join(joined, "starting a sandbox")??)),
            Err(_) => Err(Error::Setup(format!(
                "sandbox {name} was not ready in time; it is removed once its start returns (raise the ready timeout?)"
            ))),
        }
    }

    /// A handle on a running sandbox by name (`sifbox start --name NAME`).
    /// Dropping it leaves the sandbox running; [`AsyncSandbox::stop`] stops it.
    ///
    /// ```no_run
    /// # async fn demo() -> sifbox_engine::Result<()> {
    /// let sb = sifbox_engine::aio::AsyncSandbox::attach("web-task-3").await?;
    /// let out = sb.command("uname").arg("-a").output().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn attach(name: &str) -> Result<AsyncSandbox> {
        let name = name.to_string();
        let sb = blocking("attaching to a sandbox", move || Sandbox::attach(&name)).await?;
        Ok(AsyncSandbox::wrap(sb))
    }

    fn wrap(sb: Sandbox) -> AsyncSandbox {
        AsyncSandbox {
            inner: Arc::new(Inner {
                name: sb.name().to_string(),
                dir: sb.dir().to_path_buf(),
                supervisor_pid: sb.supervisor_pid(),
                evidence: sb.evidence_path(),
                handle: Mutex::new(Some(sb)),
            }),
        }
    }

    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its runtime dir.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Host pid of its outer supervisor.
    pub fn supervisor_pid(&self) -> Option<i32> {
        self.inner.supervisor_pid
    }

    /// Where its sandbox.json (the evidence of how it ran) is.
    pub fn evidence_path(&self) -> Option<&Path> {
        self.inner.evidence.as_deref()
    }

    fn handle(&self) -> MutexGuard<'_, Option<Sandbox>> {
        self.inner
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn gone(&self) -> Error {
        not_running(&self.inner.name)
    }

    /// A round trip through the control socket.
    pub async fn ping(&self) -> Result<()> {
        let (name, dir) = (self.inner.name.clone(), self.inner.dir.clone());
        blocking("pinging a sandbox", move || {
            let conn = connect(&name, &dir)?;
            protocol::send(&conn, &Request::Ping, &[]).map_err(|e| proto(&name, e))?;
            match protocol::recv::<Event>(&conn) {
                Ok((Event::Ok { .. }, _)) => Ok(()),
                Ok((other, _)) => Err(Error::Protocol {
                    name,
                    why: format!("unexpected {other:?}"),
                }),
                Err(e) => Err(proto(&name, e)),
            }
        })
        .await
    }

    /// Sets the environment that [`AsyncSandbox::command`] starts from
    /// (stored 0600: values may be secrets). Without it, commands start
    /// from PATH, HOME=/root and LANG=C.
    pub async fn set_base_env(&self, env: Vec<(String, String)>) -> Result<()> {
        let this = self.clone();
        blocking("storing the base environment", move || {
            match this.handle().as_ref() {
                Some(sb) => sb.set_base_env(&env),
                None => Err(this.gone()),
            }
        })
        .await
    }

    /// The environment that [`AsyncSandbox::command`] starts from.
    pub async fn base_env(&self) -> Result<Vec<(String, String)>> {
        let this = self.clone();
        blocking("reading the base environment", move || {
            match this.handle().as_ref() {
                Some(sb) => sb.base_env(),
                None => Err(this.gone()),
            }
        })
        .await
    }

    /// A command to run in the sandbox, starting from its base environment,
    /// in `/`, as root; see [`Command`].
    pub fn command(&self, program: impl Into<String>) -> Command {
        Command {
            sandbox: self.clone(),
            argv: vec![program.into()],
            env: Vec::new(),
            cwd: "/".into(),
            user: None,
            timeout: None,
            stdin: None,
            max_output: DEFAULT_MAX_OUTPUT,
            stdio: SpawnStdio::default(),
        }
    }

    /// Runs `req` with stdin from /dev/null and captures its output (the
    /// last [`DEFAULT_MAX_OUTPUT`] bytes of each stream). The environment is
    /// exactly `req.env` ([`AsyncSandbox::command`] adds the base one).
    ///
    /// Returns once the command has ended, with what it wrote until then;
    /// processes it left running in the background keep running (and
    /// [`AsyncSandbox::stop`] ends them). With `req.timeout_ms`, every
    /// process it started is killed at the timeout and the exit code is 124.
    /// Dropping the future while the command runs kills every process it
    /// started, too.
    ///
    /// ```no_run
    /// use sifbox_engine::protocol::ExecRequest;
    /// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
    /// let out = sb
    ///     .exec(ExecRequest {
    ///         argv: vec!["sh".into(), "-c".into(), "make test".into()],
    ///         env: vec![("PATH".into(), "/usr/bin:/bin".into())],
    ///         cwd: "/src".into(),
    ///         timeout_ms: Some(600_000),
    ///         ..Default::default()
    ///     })
    ///     .await?;
    /// if out.timed_out {
    ///     eprintln!("timed out; partial output: {}", out.stdout);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput> {
        self.exec_capture(req, None, DEFAULT_MAX_OUTPUT).await
    }

    /// [`AsyncSandbox::exec`] with `stdin` as the command's input and its
    /// own output limit per stream.
    pub async fn exec_capture(
        &self,
        req: ExecRequest,
        stdin: Option<Vec<u8>>,
        max_output: usize,
    ) -> Result<ExecOutput> {
        if req.tty {
            return Err(no_tty());
        }
        let started = Instant::now();
        let stdio = SpawnStdio {
            stdin: if stdin.is_some() {
                Stdio::Piped
            } else {
                Stdio::Null
            },
            stdout: Stdio::Piped,
            stderr: Stdio::Piped,
        };
        let (mut events, ends) = self.send_exec(req, stdio).await?;
        let name = &self.inner.name;
        let Ends {
            stdin: input,
            stdout,
            stderr,
        } = ends;
        let feed = async move {
            if let (Some(mut w), Some(data)) = (input, stdin) {
                // A command that does not read all of it gets EPIPE'd.
                let _ = w.write_all(&data).await;
            }
            std::future::pending::<()>().await;
        };
        let collect = async {
            let (mut out, mut err) = (Tail::new(max_output), Tail::new(max_output));
            let (mut o, mut e) = (stdout, stderr);
            let (mut ob, mut eb) = (vec![0u8; 16384], vec![0u8; 16384]);
            let status = loop {
                tokio::select! {
                    r = read_opt(o.as_mut(), &mut ob) => match r {
                        Ok(n) if n > 0 => out.push(&ob[..n]),
                        _ => o = None,
                    },
                    r = read_opt(e.as_mut(), &mut eb) => match r {
                        Ok(n) if n > 0 => err.push(&eb[..n]),
                        _ => e = None,
                    },
                    ev = events.next() => match ev {
                        Ok(Some(ev)) => {
                            if let Some(st) = ExecStatus::from_event(ev) {
                                break Ok(st);
                            }
                        }
                        Ok(None) => break Err(stopped_while_running(name)),
                        Err(e) => break Err(Error::Protocol { name: name.clone(), why: e.to_string() }),
                    },
                }
            };
            // The command has ended, so what it wrote is in the pipes: take
            // that without waiting for processes it left running, which may
            // hold the pipes open for as long as they live.
            drain(o, &mut out);
            drain(e, &mut err);
            status.map(|st| (st, out, err))
        };
        tokio::pin!(collect, feed);
        let (status, out, err) = tokio::select! {
            r = &mut collect => r?,
            () = &mut feed => unreachable!("feeding stdin never ends by itself"),
        };
        Ok(ExecOutput::new(
            status,
            out.finish(),
            err.finish(),
            started.elapsed(),
        ))
    }

    /// Starts `req` with its stdin, stdout and stderr piped to the returned
    /// [`Process`] and returns once it runs (or could not start: then
    /// [`Process::wait`] tells why). The environment is exactly `req.env`.
    ///
    /// ```no_run
    /// use sifbox_engine::protocol::ExecRequest;
    /// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
    /// let mut p = sb
    ///     .spawn(ExecRequest {
    ///         argv: vec!["/usr/local/bin/agent".into(), "--acp".into()],
    ///         env: sb.base_env().await?,
    ///         cwd: "/workspace".into(),
    ///         ..Default::default()
    ///     })
    ///     .await?;
    /// p.writeline(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#).await?;
    /// while let Some(line) = p.readline().await? {
    ///     println!("agent: {line}");
    /// }
    /// let status = p.wait().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn spawn(&self, req: ExecRequest) -> Result<Process> {
        self.spawn_with(req, SpawnStdio::default()).await
    }

    /// [`AsyncSandbox::spawn`] with other stdio, e.g. stderr to /dev/null
    /// for a chatty agent whose stderr nobody reads.
    pub async fn spawn_with(&self, mut req: ExecRequest, stdio: SpawnStdio) -> Result<Process> {
        if req.tty {
            return Err(no_tty());
        }
        if req.stop_after {
            return Err(Error::BadInput {
                what: "ExecRequest::stop_after".into(),
                why: "a spawned process cannot be the sandbox's last command".into(),
                fix: "wait for the process, then call AsyncSandbox::stop".into(),
            });
        }
        let id = match req.detach_id.take() {
            Some(id) => {
                if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric())
                {
                    return Err(Error::BadInput {
                        what: format!("exec id {id:?}"),
                        why: "ids are 1 to 64 letters and digits".into(),
                        fix: "leave detach_id empty to get a random id".into(),
                    });
                }
                id
            }
            None => random_id(),
        };
        // With three stdio descriptors (no status descriptor) the exec stays
        // attached to this connection, and the id registers it for Signal.
        req.detach_id = Some(id.clone());
        let (events, ends) = self.send_exec(req, stdio).await?;
        let mut p = Process {
            stdin: ends.stdin,
            stdout: ends.stdout.map(BufReader::new),
            stderr: ends.stderr.map(BufReader::new),
            id,
            pid: None,
            name: self.inner.name.clone(),
            dir: self.inner.dir.clone(),
            events,
            status: None,
            line: Vec::new(),
        };
        match p.events.next().await {
            Ok(Some(Event::Started { pid })) => p.pid = Some(pid),
            Ok(Some(ev)) => p.status = ExecStatus::from_event(ev),
            Ok(None) => return Err(stopped_while_running(&p.name)),
            Err(e) => {
                return Err(Error::Protocol {
                    name: p.name,
                    why: e.to_string(),
                })
            }
        }
        Ok(p)
    }

    /// Sends an exec request with the far ends of `stdio`; returns the
    /// connection its events come on and our ends of the pipes.
    async fn send_exec(&self, req: ExecRequest, stdio: SpawnStdio) -> Result<(Events, Ends)> {
        let (in_far, in_near) = stdio_ends(0, stdio.stdin)?;
        let (out_far, out_near) = stdio_ends(1, stdio.stdout)?;
        let (err_far, err_near) = stdio_ends(2, stdio.stderr)?;
        let ends = Ends {
            stdin: in_near
                .map(pipe::Sender::from_owned_fd)
                .transpose()
                .ctx(|| "registering a pipe with tokio".into())?,
            stdout: out_near
                .map(pipe::Receiver::from_owned_fd)
                .transpose()
                .ctx(|| "registering a pipe with tokio".into())?,
            stderr: err_near
                .map(pipe::Receiver::from_owned_fd)
                .transpose()
                .ctx(|| "registering a pipe with tokio".into())?,
        };
        let (name, dir) = (self.inner.name.clone(), self.inner.dir.clone());
        // Connecting blocks while the supervisor's backlog is full, and a
        // large request may not fit the socket buffer: off the runtime.
        let conn = blocking("sending an exec request", move || {
            let conn = connect(&name, &dir)?;
            let fds = [in_far.as_fd(), out_far.as_fd(), err_far.as_fd()];
            protocol::send(&conn, &Request::Exec(req), &fds).map_err(|e| proto(&name, e))?;
            // Our copies of the far ends close here: only the command holds
            // them now, so its output ends when its processes are gone.
            drop((in_far, out_far, err_far));
            Ok(conn)
        })
        .await?;
        conn.set_nonblocking(true)
            .ctx(|| "making the control connection non-blocking".into())?;
        let conn =
            UnixStream::from_std(conn).ctx(|| "registering a connection with tokio".into())?;
        Ok((
            Events {
                conn,
                buf: Vec::new(),
            },
            ends,
        ))
    }

    /// Copies `src` on the host (a file or a directory, symlinks kept as
    /// links) into the sandbox at `dst`, as `docker cp` does: into `dst`
    /// when it is a directory, else as `dst`. With `owner` (a user of the
    /// image: name or uid) the copy belongs to that user, else to root.
    ///
    /// ```no_run
    /// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
    /// sb.upload("tests/fixtures", "/workspace/fixtures", Some("1000")).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn upload(
        &self,
        src: impl AsRef<Path>,
        dst: &str,
        owner: Option<&str>,
    ) -> Result<()> {
        let (src, dst, owner) = (
            src.as_ref().to_path_buf(),
            dst.to_string(),
            owner.map(str::to_string),
        );
        let this = self.clone();
        blocking("uploading", move || {
            this.attached()?.upload(&src, &dst, owner.as_deref())
        })
        .await
    }

    /// Copies `src` in the sandbox (a file or a directory; symlinks are
    /// copied as links and never followed) to `dst` on the host, as
    /// `docker cp` does, setuid and setgid bits dropped.
    ///
    /// ```no_run
    /// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
    /// sb.download("/logs/agent", "results/run-17").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn download(&self, src: &str, dst: impl AsRef<Path>) -> Result<()> {
        let (src, dst) = (src.to_string(), dst.as_ref().to_path_buf());
        let this = self.clone();
        blocking("downloading", move || this.attached()?.download(&src, &dst)).await
    }

    /// A sync handle for one transfer on a blocking thread (the owning one
    /// stays free for stop and drop).
    fn attached(&self) -> Result<Sandbox> {
        let sb = Sandbox::attach(&self.inner.name).map_err(|_| self.gone())?;
        if sb.dir() != self.inner.dir {
            return Err(Error::BadInput {
                what: format!("sandbox {}", self.inner.name),
                why: format!(
                    "the runtime dir changed since it was started (now {}, was {})",
                    sb.dir().display(),
                    self.inner.dir.display()
                ),
                fix: "keep SIFBOX_RUNTIME unchanged while sandboxes run".into(),
            });
        }
        Ok(sb)
    }

    /// Stops the sandbox: SIGTERM to every process, SIGKILL after `grace`;
    /// returns once no process, mount or runtime dir of it is left. Stopping
    /// a sandbox that another clone (or anything else) already stopped
    /// succeeds.
    ///
    /// ```no_run
    /// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
    /// sb.stop(std::time::Duration::from_secs(10)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn stop(&self, grace: Duration) -> Result<()> {
        let taken = self.handle().take();
        match taken {
            Some(sb) => blocking("stopping a sandbox", move || sb.stop(grace)).await,
            None => Ok(()),
        }
    }

    /// Lets the sandbox run on after every handle is gone (`sifbox start`);
    /// find it again with [`AsyncSandbox::attach`].
    pub fn detach(self) {
        if let Some(sb) = self.handle().take() {
            sb.detach();
        }
    }
}

/// A command being built for [`AsyncSandbox::command`], as
/// `tokio::process::Command`: it starts from the sandbox's base environment
/// (later [`Command::env`] calls win), in `/`, as root, with no timeout; HOME
/// becomes the user's home from the image's /etc/passwd when
/// [`Command::user`] is set and HOME is not.
///
/// ```no_run
/// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
/// use std::time::Duration;
/// let out = sb
///     .command("pytest")
///     .args(["-q", "tests/"])
///     .cwd("/workspace")
///     .user("1000")
///     .env("OPENAI_API_KEY", "sk-...")
///     .timeout(Duration::from_secs(900))
///     .output()
///     .await?;
/// println!("exit {} in {} ms", out.exit_code, out.duration_ms);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Command {
    sandbox: AsyncSandbox,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    user: Option<String>,
    timeout: Option<Duration>,
    stdin: Option<Vec<u8>>,
    max_output: usize,
    stdio: SpawnStdio,
}

impl Command {
    /// Adds an argument.
    pub fn arg(&mut self, arg: impl Into<String>) -> &mut Command {
        self.argv.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable (it travels inside the request only).
    pub fn env(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Command {
        let key = key.into();
        let value = value.into();
        spec::set_env(&mut self.env, &key, &value);
        self
    }

    /// Sets environment variables.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Command
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    /// The working directory inside the sandbox (default `/`).
    pub fn cwd(&mut self, dir: impl Into<String>) -> &mut Command {
        self.cwd = dir.into();
        self
    }

    /// Runs as this user of the image: `name`, `uid`, `uid:gid` or
    /// `name:group` (default root).
    pub fn user(&mut self, user: impl Into<String>) -> &mut Command {
        self.user = Some(user.into());
        self
    }

    /// Kills every process the command started after `timeout`; the exit
    /// code is then 124.
    pub fn timeout(&mut self, timeout: Duration) -> &mut Command {
        self.timeout = Some(timeout);
        self
    }

    /// The input of [`Command::output`] (default: /dev/null).
    pub fn stdin_bytes(&mut self, input: impl Into<Vec<u8>>) -> &mut Command {
        self.stdin = Some(input.into());
        self
    }

    /// How much of each stream [`Command::output`] keeps (the tail; default
    /// [`DEFAULT_MAX_OUTPUT`]).
    pub fn max_output(&mut self, bytes: usize) -> &mut Command {
        self.max_output = bytes;
        self
    }

    /// The stdio of [`Command::spawn`] (default: all piped).
    pub fn stdio(&mut self, stdio: SpawnStdio) -> &mut Command {
        self.stdio = stdio;
        self
    }

    /// The exec request this command makes.
    pub async fn request(&self) -> Result<ExecRequest> {
        let mut env = self.sandbox.base_env().await?;
        for (k, v) in &self.env {
            spec::set_env(&mut env, k, v);
        }
        Ok(ExecRequest {
            argv: self.argv.clone(),
            env,
            cwd: self.cwd.clone(),
            user: self.user.clone(),
            default_home: !self.env.iter().any(|(k, _)| k == "HOME"),
            timeout_ms: self
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)),
            ..Default::default()
        })
    }

    /// Runs the command and captures its output ([`AsyncSandbox::exec`]).
    pub async fn output(&self) -> Result<ExecOutput> {
        let req = self.request().await?;
        self.sandbox
            .exec_capture(req, self.stdin.clone(), self.max_output)
            .await
    }

    /// Starts the command ([`AsyncSandbox::spawn`]).
    pub async fn spawn(&self) -> Result<Process> {
        let req = self.request().await?;
        self.sandbox.spawn_with(req, self.stdio).await
    }
}

/// A command running in a sandbox, from [`AsyncSandbox::spawn`].
///
/// Dropping it while the command runs kills every process the command
/// started (the supervisor sees the connection go). Processes the command
/// left behind after it ended live on until [`Process::kill`] or the
/// sandbox's stop.
#[derive(Debug)]
pub struct Process {
    /// The command's stdin, when piped.
    pub stdin: Option<pipe::Sender>,
    /// The command's stdout, when piped; [`Process::readline`] reads it
    /// through this same buffer.
    pub stdout: Option<BufReader<pipe::Receiver>>,
    /// The command's stderr, when piped.
    pub stderr: Option<BufReader<pipe::Receiver>>,
    id: String,
    pid: Option<i32>,
    name: String,
    dir: PathBuf,
    events: Events,
    status: Option<ExecStatus>,
    /// A line being read by [`Process::readline`] (kept across a cancelled
    /// call).
    line: Vec<u8>,
}

impl Process {
    /// The exec id (for `sifbox kill NAME ID` while it runs).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The command's pid inside the sandbox (`None` if it could not start).
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Writes `line` and a newline to the command's stdin and flushes (one
    /// message of a newline-delimited protocol such as JSON-RPC over stdio).
    /// A line may not contain a newline itself. Not cancellation safe: a
    /// write cut short leaves part of a line in the pipe.
    pub async fn writeline(&mut self, line: &str) -> Result<()> {
        if line.contains('\n') {
            return Err(Error::BadInput {
                what: "Process::writeline".into(),
                why: "the line contains a newline".into(),
                fix: "encode messages on one line (JSON does: newlines in strings are escaped)"
                    .into(),
            });
        }
        let stdin = self.stdin.as_mut().ok_or_else(|| Error::BadInput {
            what: format!("stdin of exec {}", self.id),
            why: "it is not piped or was closed".into(),
            fix: "spawn with Stdio::Piped stdin and write before wait()".into(),
        })?;
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        stdin
            .write_all(&buf)
            .await
            .ctx(|| format!("writing to the stdin of exec {}", self.id))?;
        stdin
            .flush()
            .await
            .ctx(|| format!("writing to the stdin of exec {}", self.id))
    }

    /// Reads the next line of the command's stdout, without its newline;
    /// `None` once stdout is closed (a last line without a newline is
    /// returned first). Cancellation safe: a call cut short (say, by
    /// `tokio::time::timeout`) loses nothing; the next call goes on with the
    /// same line. A line that is not UTF-8 is an error.
    pub async fn readline(&mut self) -> Result<Option<String>> {
        let id = self.id.clone();
        let stdout = self.stdout.as_mut().ok_or_else(|| Error::BadInput {
            what: format!("stdout of exec {id}"),
            why: "it is not piped".into(),
            fix: "spawn with Stdio::Piped stdout".into(),
        })?;
        let n = stdout
            .read_until(b'\n', &mut self.line)
            .await
            .ctx(|| format!("reading the stdout of exec {id}"))?;
        if n == 0 && self.line.is_empty() {
            return Ok(None);
        }
        let mut line = std::mem::take(&mut self.line);
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        String::from_utf8(line).map(Some).map_err(|e| {
            Error::io(
                format!("reading the stdout of exec {id}"),
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })
    }

    /// Closes the command's stdin (it then reads end-of-file).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the command to end; closes its stdin first (as
    /// `tokio::process::Child::wait` does, so a command reading it can end).
    /// 128+N means it was killed by signal N (137 after [`Process::kill`]);
    /// 124 that it hit its timeout. Cancellation safe; may be called again.
    pub async fn wait(&mut self) -> Result<ExecStatus> {
        self.stdin = None;
        if let Some(st) = &self.status {
            return Ok(st.clone());
        }
        loop {
            match self.events.next().await {
                Ok(Some(ev)) => {
                    if let Some(st) = ExecStatus::from_event(ev) {
                        self.status = Some(st.clone());
                        return Ok(st);
                    }
                }
                Ok(None) => return Err(stopped_while_running(&self.name)),
                Err(e) => {
                    return Err(Error::Protocol {
                        name: self.name.clone(),
                        why: e.to_string(),
                    })
                }
            }
        }
    }

    /// Kills every process of this exec with SIGKILL (the command, its
    /// children, and whatever called `setsid` or daemonized below it, before
    /// or after the command itself ended) and returns once none is left.
    /// [`Process::wait`] then reports 137 (unless the command had ended
    /// already). Killing an exec that is over succeeds.
    pub async fn kill(&mut self) -> Result<()> {
        let deadline = Instant::now() + KILL_LIMIT;
        let mut pause = Duration::from_millis(1);
        while signal_exec(&self.name, &self.dir, &self.id, SIGKILL).await? {
            if Instant::now() >= deadline {
                return Err(Error::Protocol {
                    name: self.name.clone(),
                    why: format!(
                        "exec {} still has processes {} s after SIGKILL",
                        self.id,
                        KILL_LIMIT.as_secs()
                    ),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Sends `signal` (e.g. 15 for SIGTERM) to the command's process group,
    /// and to those of processes below it that lead their own; SIGKILL
    /// reaches every process of the exec (see [`Process::kill`], which also
    /// waits). Fails when no process of the exec is left.
    pub async fn signal(&self, signal: i32) -> Result<()> {
        if signal_exec(&self.name, &self.dir, &self.id, signal).await? {
            Ok(())
        } else {
            Err(Error::BadInput {
                what: format!("exec {} of sandbox {}", self.id, self.name),
                why: "it is no longer running".into(),
                fix: "check Process::wait for how it ended".into(),
            })
        }
    }
}

/// Our ends of a command's stdio pipes.
struct Ends {
    stdin: Option<pipe::Sender>,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
}

/// The events of one exec, read from its control connection. Frames are a
/// little-endian u32 length and JSON ([`protocol`]); buffered here, so
/// reading is cancellation safe.
#[derive(Debug)]
struct Events {
    conn: UnixStream,
    buf: Vec<u8>,
}

impl Events {
    /// The next event; `None` when the connection closed.
    async fn next(&mut self) -> std::io::Result<Option<Event>> {
        loop {
            if self.buf.len() >= 4 {
                let mut header = [0u8; 4];
                header.copy_from_slice(&self.buf[..4]);
                let len = u32::from_le_bytes(header);
                if len > protocol::MAX_FRAME {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("frame of {len} bytes is larger than the limit"),
                    ));
                }
                let end = 4 + len as usize;
                if self.buf.len() >= end {
                    let ev = serde_json::from_slice(&self.buf[4..end]).map_err(|e| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("malformed frame: {e}"),
                        )
                    })?;
                    self.buf.drain(..end);
                    return Ok(Some(ev));
                }
                self.buf.reserve(end - self.buf.len());
            }
            if self.conn.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }
}

/// Reads from `r`, or waits forever when there is none.
async fn read_opt(r: Option<&mut pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Reads what `r` holds right now (its fd is non-blocking) into `tail`.
fn drain(r: Option<pipe::Receiver>, tail: &mut Tail) {
    let Some(r) = r else { return };
    let mut buf = [0u8; 16384];
    loop {
        match rustix::io::read(&r, &mut buf) {
            Ok(0) => return,
            Ok(n) => tail.push(&buf[..n]),
            Err(rustix::io::Errno::INTR) => {}
            // EAGAIN: nothing more for now, and the command is gone.
            Err(_) => return,
        }
    }
}

/// The far end (for the sandbox) and our end (when piped) of stdio stream
/// `which` (0, 1, 2).
fn stdio_ends(which: u8, how: Stdio) -> Result<(OwnedFd, Option<OwnedFd>)> {
    match how {
        Stdio::Piped => {
            let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
            Ok(if which == 0 {
                (r, Some(w))
            } else {
                (w, Some(r))
            })
        }
        Stdio::Null => {
            let f = OpenOptions::new()
                .read(which == 0)
                .write(which != 0)
                .open("/dev/null")
                .ctx(|| "opening /dev/null".into())?;
            Ok((OwnedFd::from(f), None))
        }
        Stdio::Inherit => {
            let fd = match which {
                0 => std::io::stdin().as_fd().try_clone_to_owned(),
                1 => std::io::stdout().as_fd().try_clone_to_owned(),
                _ => std::io::stderr().as_fd().try_clone_to_owned(),
            };
            Ok((fd.ctx(|| "duplicating this process's stdio".into())?, None))
        }
    }
}

/// Sends `signal` to exec `id`; returns whether the supervisor still knew
/// it (false: every process of it is gone, or the sandbox is).
async fn signal_exec(name: &str, dir: &Path, id: &str, signal: i32) -> Result<bool> {
    let (name, dir, id) = (name.to_string(), dir.to_path_buf(), id.to_string());
    blocking("signalling an exec", move || {
        let conn = match connect(&name, &dir) {
            Ok(c) => c,
            // A sandbox that is gone took every process of it along.
            Err(_) if !is_alive(&dir) => return Ok(false),
            Err(e) => return Err(e),
        };
        let req = Request::Signal {
            exec_id: id,
            signal,
        };
        protocol::send(&conn, &req, &[]).map_err(|e| proto(&name, e))?;
        match protocol::recv::<Event>(&conn) {
            Ok((Event::Ok { .. }, _)) => Ok(true),
            // "no running exec": its subreaper is reaped.
            Ok((Event::Error { .. }, _)) => Ok(false),
            Ok((other, _)) => Err(Error::Protocol {
                name,
                why: format!("unexpected {other:?}"),
            }),
            Err(ProtocolError::Closed) if !is_alive(&dir) => Ok(false),
            Err(e) => Err(proto(&name, e)),
        }
    })
    .await
}

/// Whether the sandbox whose runtime dir is `dir` runs.
fn is_alive(dir: &Path) -> bool {
    runtime::read_state(dir).is_some_and(|s| runtime::is_alive(&s))
}

/// Connects to a sandbox's control socket; a sandbox that is not running is
/// a clear error.
fn connect(name: &str, dir: &Path) -> Result<StdUnixStream> {
    sandbox::connect(dir).map_err(|e| {
        if is_alive(dir) {
            Error::Protocol {
                name: name.to_string(),
                why: format!("cannot reach its control socket: {e}"),
            }
        } else {
            not_running(name)
        }
    })
}

fn not_running(name: &str) -> Error {
    Error::BadInput {
        what: format!("sandbox {name:?}"),
        why: "it is not running (it was stopped, or its supervisor died)".into(),
        fix:
            "start it again; `sifbox ps` lists running sandboxes and `sifbox gc` removes dead ones"
                .into(),
    }
}

fn stopped_while_running(name: &str) -> Error {
    Error::Protocol {
        name: name.to_string(),
        why: "the command ended without an exit status: the sandbox stopped, or something in it killed the process that ran the command".into(),
    }
}

fn no_tty() -> Error {
    Error::BadInput {
        what: "ExecRequest::tty".into(),
        why: "the async API does not allocate ptys".into(),
        fix: "use Sandbox::exec_tty".into(),
    }
}

fn proto(name: &str, e: ProtocolError) -> Error {
    Error::Protocol {
        name: name.to_string(),
        why: e.to_string(),
    }
}

/// Runs `f` on tokio's blocking pool; a panic there resumes here.
async fn blocking<T, F>(what: &'static str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    join(tokio::task::spawn_blocking(f).await, what)?
}

fn join<T>(r: std::result::Result<T, tokio::task::JoinError>, what: &str) -> Result<T> {
    r.map_err(|e| {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
        Error::io(what, std::io::Error::other(e))
    })
}

fn random_id() -> String {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b.copy_from_slice(&n.to_le_bytes()[..8]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::new(4);
        t.push(b"ab");
        t.push(b"cdef");
        assert_eq!(t.finish(), ("cdef".to_string(), true));
        let mut t = Tail::new(4);
        t.push(b"abc");
        assert_eq!(t.finish(), ("abc".to_string(), false));
    }

    #[tokio::test]
    async fn events_survive_split_frames() {
        let (a, b) = StdUnixStream::pair().expect("pair");
        b.set_nonblocking(true).expect("nonblocking");
        let mut events = Events {
            conn: UnixStream::from_std(b).expect("tokio"),
            buf: Vec::new(),
        };
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let mut bytes = Vec::new();
            for ev in [
                Event::Started { pid: 7 },
                Event::Exit {
                    code: 3,
                    timed_out: false,
                    time_ns: 1,
                },
            ] {
                let body = serde_json::to_vec(&ev).expect("json");
                let len = u32::try_from(body.len()).expect("len");
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(&body);
            }
            // One byte at a time: every split point of both frames.
            for byte in bytes {
                (&a).write_all(&[byte]).expect("write");
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        assert_eq!(
            events.next().await.expect("read"),
            Some(Event::Started { pid: 7 })
        );
        let ev = events.next().await.expect("read").expect("event");
        assert_eq!(
            ExecStatus::from_event(ev),
            Some(ExecStatus::Exited {
                code: 3,
                timed_out: false
            })
        );
        writer.join().expect("writer");
        assert_eq!(events.next().await.expect("eof"), None);
    }

    #[test]
    fn default_spec_checks_its_input() {
        assert!(default_spec("bad name", "/").is_err());
        assert!(default_spec("ok", "/nonexistent-root-for-sure").is_err());
        let s = default_spec(&"n".repeat(100), "/").expect("spec");
        assert_eq!(s.hostname.len(), 64);
        assert_eq!(s.rootfs, PathBuf::from("/"));
    }
}
