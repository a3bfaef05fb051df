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

use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use crate::idmap;
use crate::protocol::{self, Event, ProtocolError, Request};
use crate::runtime;
use crate::sandbox::{self, Sandbox, StartOptions};
use crate::spec::{self, SandboxSpec, UsernsMode};

/// Captured output is limited to this much per stream unless asked otherwise
/// (the tail is kept).
mod command;
mod exec;
mod process;

pub use command::Command;
pub use process::{Process, SpawnStdio, Stdio};

pub(crate) mod error;
pub use error::AioError;

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
    let rootfs = std::fs::canonicalize(given).map_err(|source| AioError::Rootfs {
        path: given.to_path_buf(),
        source,
    })?;
    if !rootfs.is_dir() {
        return Err(AioError::RootfsNotDir(given.to_path_buf()).into());
    }
    let ids = idmap::resolve(UsernsMode::Auto, &idmap::Caller::current())?;
    Ok(SandboxSpec::new(name, rootfs, ids))
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
            return Err(AioError::OneShot.into());
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
            Err(_) => Err(AioError::NotReadyInTime { name }.into()),
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

    /// What a command starts from: the exec defaults and the base
    /// environment, read in one trip to the blocking pool.
    pub(super) async fn exec_start(&self) -> Result<(crate::ExecDefaults, Vec<(String, String)>)> {
        let this = self.clone();
        blocking(
            "reading the exec defaults and base environment",
            move || match this.handle().as_ref() {
                Some(sb) => Ok((sb.exec_defaults()?, sb.base_env()?)),
                None => Err(this.gone()),
            },
        )
        .await
    }

    /// What execs default to (the image's WORKDIR, USER and env scripts, as
    /// `sifbox start IMAGE` recorded them; nothing special otherwise).
    pub async fn exec_defaults(&self) -> Result<crate::ExecDefaults> {
        let this = self.clone();
        blocking("reading the exec defaults", move || {
            match this.handle().as_ref() {
                Some(sb) => sb.exec_defaults(),
                None => Err(this.gone()),
            }
        })
        .await
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
            return Err(AioError::RuntimeDirChanged {
                name: self.inner.name.clone(),
                now: sb.dir().to_path_buf(),
                was: self.inner.dir.clone(),
            }
            .into());
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
    AioError::NotRunning(name.to_string()).into()
}

fn stopped_while_running(name: &str) -> Error {
    Error::Protocol {
        name: name.to_string(),
        why: "the command ended without an exit status: the sandbox stopped, or something in it killed the process that ran the command".into(),
    }
}

fn no_tty() -> Error {
    AioError::Tty.into()
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

#[cfg(test)]
mod tests {
    use tokio::net::UnixStream;

    use super::process::Events;
    use super::*;
    use crate::sandbox::{ExecStatus, Tail};

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
                    denied: Vec::new(),
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
