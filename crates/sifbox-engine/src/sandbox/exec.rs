//! The client side of an exec: the request, the command's exit (and why:
//! a timeout, a kill for memory), captured output and ptys. The worker
//! side, inside the sandbox, is [`crate::worker`].

use super::exit::wait_exit;
use std::fs::File;
use std::io::BufRead;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::pipe::{pipe_with, PipeFlags};

use super::{ExecStatus, Sandbox};
use crate::denials::Denied;
use crate::error::{Error, IoContext, Result};
use crate::protocol::{self, Event, ExecRequest, ProtocolError, Request};

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
        self.wait_reporting(name).map(|(st, _)| st)
    }

    /// Waits for the command to end; also the calls the default seccomp
    /// policy denied during the exec.
    pub fn wait_reporting(self, name: &str) -> Result<(ExecStatus, Vec<Denied>)> {
        wait_exit(&self.conn, name).map(|(st, _, denied)| (st, denied))
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
    /// The calls the default seccomp policy denied during the exec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<Denied>,
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
            denied: Vec::new(),
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
    use super::relay::{readable_now, wait_input, Wait};
    let mut tails = [Tail::new(max), Tail::new(max)];
    let mut open = [Some(out), Some(err)];
    let mut buf = vec![0u8; 65536];
    let mut draining = false;
    while open.iter().any(Option::is_some) {
        if !draining {
            let fds: Vec<BorrowedFd<'_>> = open.iter().flatten().map(AsFd::as_fd).collect();
            match wait_input(&fds, stop.as_fd()) {
                Wait::Interrupted => continue,
                Wait::Failed => break,
                Wait::Stopped => draining = true,
                Wait::Input => {}
            }
        }
        for (slot, tail) in open.iter_mut().zip(tails.iter_mut()) {
            let Some(fd) = slot else { continue };
            if !draining && !readable_now(fd.as_fd()) {
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

impl Sandbox {
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
        // The caller's file or terminal reaches the command as a pipe.
        let relayed = stdin
            .map(super::relay::relayed_input)
            .transpose()?
            .flatten();
        let input = relayed
            .as_ref()
            .map(AsFd::as_fd)
            .or(stdin)
            .unwrap_or(null.as_fd());
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
        let (status, denied) = self.exec_ended(ended, kills_before, last)?;
        let mut out = ExecOutput::new(
            status,
            (stdout, out_cut),
            (stderr, err_cut),
            started.elapsed(),
        );
        out.denied = denied;
        Ok(out)
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
        let ended = wait_exit(&conn, &self.name);
        Ok(self.exec_ended(ended, kills_before, last)?.0)
    }

    /// An exec's end as [`wait_exit`] read it, made its status: read for
    /// a memory limit ([`Self::over_memory`]), noted when the exec was the
    /// sandbox's `last`, its denied calls reported (and returned).
    pub(super) fn exec_ended(
        &self,
        ended: Result<(ExecStatus, u64, Vec<Denied>)>,
        kills_before: Option<u64>,
        last: bool,
    ) -> Result<(ExecStatus, Vec<Denied>)> {
        let mut denied = Vec::new();
        let ended = ended.map(|(st, t, d)| {
            denied = d;
            (st, t)
        });
        let (status, t) = self.over_memory(ended, kills_before, last)?;
        self.note_last(last, t);
        self.note_denied(&denied);
        Ok((status, denied))
    }

    /// With a memory limit, the kills for it so far (to tell whether an
    /// exec's end was one).
    pub(super) fn oom_kills_now(&self) -> Option<u64> {
        self.limits
            .applied
            .iter()
            .any(|a| a.limit == "memory")
            .then(|| self.usage().oom_kills)
    }

    /// An exec's end, read for a memory limit at work: a command killed
    /// (or a sandbox that went) while the limit's killer acted is said to
    /// have gone over it, with Docker's exit code 137. `before`: the kills
    /// when the exec started; `last`: the exec was the sandbox's last
    /// (`stop_after`).
    ///
    /// The kills are counted before the command is seen to die (the
    /// watchdog records its kill in usage.json before it sends SIGKILL),
    /// but after the sandbox's last command the sandbox stops at once, and
    /// its runtime dir (usage.json) and cgroup may be gone before they are
    /// read here: then outer's last status line, written after init ended
    /// and before it removes them, is the count.
    pub(super) fn over_memory(
        &self,
        ended: Result<(ExecStatus, u64)>,
        before: Option<u64>,
        last: bool,
    ) -> Result<(ExecStatus, u64)> {
        let limit = self.limits.applied.iter().find(|a| a.limit == "memory");
        let killed = matches!(
            &ended,
            Ok((ExecStatus::Exited { code: 137, .. }, _)) | Err(Error::Protocol { .. })
        );
        let Some(limit) = limit.filter(|_| killed) else {
            return ended;
        };
        let before = before.unwrap_or(0);
        let mut kills = self.usage().oom_kills;
        if ended.is_err() || (last && kills <= before) {
            // Gone, or going, runtime dir and all: outer's last status
            // line says.
            kills = kills.max(self.final_oom_kills());
        }
        if kills <= before {
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
            other => Err(self.unexpected(&other)),
        }
    }
}
