//! Running the checks that need a fresh single-threaded process (`sifbox
//! __doctor-child KIND`), bounded in time.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{io_text, last_line, CHILD_ARG, CHILD_TIMEOUT};

/// What a finished (or killed) child left.
#[derive(Debug)]
pub(super) struct Finished {
    pub(super) pid: u32,
    /// `None`: it ran past its time and was killed.
    pub(super) status: Option<ExitStatus>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// What a doctor child found.
#[derive(Debug)]
pub(super) enum ChildVerdict {
    /// Exit 0, with the note it printed on stdout.
    Works(String),
    /// Exit 1: the host refused; the line it printed on stderr.
    Refused(String),
    /// The test itself did not run properly (not started, killed, unknown kind).
    Broken(String),
}

/// A doctor child's answer.
#[derive(Debug)]
pub(super) struct ChildRun {
    /// `None` when it could not be started.
    pub(super) pid: Option<u32>,
    pub(super) verdict: ChildVerdict,
}

/// Runs `self_exe __doctor-child KIND` for at most [`CHILD_TIMEOUT`].
pub(super) fn run_child(self_exe: &Path, kind: &str) -> ChildRun {
    let mut cmd = Command::new(self_exe);
    cmd.arg(CHILD_ARG).arg(kind).env_remove("RUST_LOG");
    let run = match run_bounded(&mut cmd, CHILD_TIMEOUT) {
        Ok(run) => run,
        Err(e) => {
            return ChildRun {
                pid: None,
                verdict: ChildVerdict::Broken(format!(
                    "cannot run {} {CHILD_ARG} {kind}: {}",
                    self_exe.display(),
                    io_text(&e)
                )),
            }
        }
    };
    let why = || last_line(&run.stderr).map(str::to_owned);
    let verdict = match run.status {
        None => ChildVerdict::Broken(format!(
            "the test did not finish in {} s (killed)",
            CHILD_TIMEOUT.as_secs()
        )),
        Some(st) => match st.code() {
            Some(0) => ChildVerdict::Works(last_line(&run.stdout).unwrap_or_default().to_owned()),
            Some(1) => ChildVerdict::Refused(
                why().unwrap_or_else(|| "failed without saying why".to_owned()),
            ),
            Some(2) => ChildVerdict::Broken(format!(
                "{} does not know `{CHILD_ARG} {kind}`{}",
                self_exe.display(),
                why().map(|w| format!(": {w}")).unwrap_or_default()
            )),
            _ => ChildVerdict::Broken(format!(
                "the test {}{}",
                status_text(st),
                why().map(|w| format!(": {w}")).unwrap_or_default()
            )),
        },
    };
    ChildRun {
        pid: Some(run.pid),
        verdict,
    }
}

/// Runs `cmd` (stdin null, stdout and stderr captured) in its own process group;
/// kills the group if it runs longer than `timeout`.
pub(super) fn run_bounded(cmd: &mut Command, timeout: Duration) -> std::io::Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                // Not reaped yet, so the group id is still this child's.
                if let Some(pgid) = i32::try_from(pid)
                    .ok()
                    .and_then(rustix::process::Pid::from_raw)
                {
                    let _ =
                        rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // A grandchild could hold the pipes open: wait for the output only briefly.
    let grace = Duration::from_secs(1);
    Ok(Finished {
        pid,
        status,
        stdout: stdout.recv_timeout(grace).unwrap_or_default(),
        stderr: stderr.recv_timeout(grace).unwrap_or_default(),
    })
}

/// Reads a pipe to its end on a helper thread (keeping the first 64 KiB).
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        let _detached = std::thread::Builder::new()
            .name("doctor-pipe".to_owned())
            .spawn(move || {
                let mut buf = Vec::new();
                let _ = (&mut pipe).take(64 * 1024).read_to_end(&mut buf);
                let _ = std::io::copy(&mut pipe, &mut std::io::sink());
                let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
            });
    } else {
        let _ = tx.send(String::new());
    }
    rx
}

pub(super) fn status_text(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("ended with {status}"),
    }
}
