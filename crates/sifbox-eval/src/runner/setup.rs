//! What the set-up phases of a rollout share beyond its sandbox: the
//! setup commands' log and how one failed, BenchFlow's host locks, and
//! pauses that end when the job is cancelled.

use std::fs::File;
use std::time::{Duration, Instant};

use crate::result::one_line;

use super::error::{HostAction, RolloutError};
use super::Ctx;

/// Sleeps `d`, waking early when the job is cancelled.
pub(super) fn pause_unless_cancelled(ctx: &Ctx<'_>, d: Duration) {
    let until = Instant::now() + d;
    while !ctx.cancel.is_cancelled() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// The file of a rollout dir that holds the setup commands' output.
pub(super) const SETUP_LOG: &str = "setup.txt";

/// How the setup commands failed.
pub(super) enum SetupError {
    /// A command failed or ran past its time limit: the task's.
    Failed(String),
    /// sifbox could not run it.
    Infra(String),
}

/// `s` cut to 80 characters, on one line.
pub(super) fn short(s: &str) -> String {
    let line = one_line(s);
    if line.chars().count() > 80 {
        format!("{}...", line.chars().take(80).collect::<String>())
    } else {
        line
    }
}

/// The last `n` non-empty lines of `text`, on one line.
pub(super) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("# setup_commands["))
        .collect();
    one_line(&lines[lines.len().saturating_sub(n)..].join("\n"))
}

/// Holds a lock of this host (an flock on `locks/eval-NAME` in the image
/// store, shared by every sifbox of the store) while it lives: BenchFlow's
/// `host_lock`, so that setup commands of that name run one at a time.
pub(super) fn host_lock(ctx: &Ctx<'_>, name: &str) -> std::result::Result<File, RolloutError> {
    let dir = ctx.store.root().join("locks");
    std::fs::create_dir_all(&dir).map_err(RolloutError::host(HostAction::Creating, &dir))?;
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!("eval-{safe}"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(RolloutError::host(HostAction::Opening, &path))?;
    loop {
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(f),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                if ctx.cancel.is_cancelled() {
                    return Err(RolloutError::LockInterrupted);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(RolloutError::host(HostAction::Locking, &path)(e.into())),
        }
    }
}
