//! [`Process`]: a running exec's stdio, events and exit, and how its
//! stdio is wired ([`Stdio`], [`SpawnStdio`]).

use std::fs::OpenOptions;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::pipe::{pipe_with, PipeFlags};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;

use super::{
    blocking, connect, is_alive, proto, stopped_while_running, AioError, KILL_LIMIT, SIGKILL,
};
use crate::error::{Error, IoContext, Result};
use crate::protocol::{self, Event, ProtocolError, Request};
use crate::sandbox::{ExecStatus, Tail};

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
    pub(super) id: String,
    pub(super) pid: Option<i32>,
    pub(super) name: String,
    pub(super) dir: PathBuf,
    pub(super) events: Events,
    pub(super) status: Option<ExecStatus>,
    /// A line being read by [`Process::readline`] (kept across a cancelled
    /// call).
    pub(super) line: Vec<u8>,
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
            return Err(AioError::Newline.into());
        }
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| AioError::StdinNotPiped(self.id.clone()))?;
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
        let stdout = self
            .stdout
            .as_mut()
            .ok_or_else(|| AioError::StdoutNotPiped(id.clone()))?;
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
            Err(AioError::ExecEnded {
                id: self.id.clone(),
                name: self.name.clone(),
            }
            .into())
        }
    }
}

/// Our ends of a command's stdio pipes.
pub(super) struct Ends {
    pub(super) stdin: Option<pipe::Sender>,
    pub(super) stdout: Option<pipe::Receiver>,
    pub(super) stderr: Option<pipe::Receiver>,
}

/// The events of one exec, read from its control connection. Frames are a
/// little-endian u32 length and JSON ([`protocol`]); buffered here, so
/// reading is cancellation safe.
#[derive(Debug)]
pub(super) struct Events {
    pub(super) conn: UnixStream,
    pub(super) buf: Vec<u8>,
}

impl Events {
    /// The next event; `None` when the connection closed.
    pub(super) async fn next(&mut self) -> std::io::Result<Option<Event>> {
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
pub(super) async fn read_opt(
    r: Option<&mut pipe::Receiver>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Reads what `r` holds right now (its fd is non-blocking) into `tail`.
pub(super) fn drain(r: Option<pipe::Receiver>, tail: &mut Tail) {
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
pub(super) fn stdio_ends(which: u8, how: Stdio) -> Result<(OwnedFd, Option<OwnedFd>)> {
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
