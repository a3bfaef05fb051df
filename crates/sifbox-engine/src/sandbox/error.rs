//! Why starting, reaching or stopping a sandbox failed (a leaf).

use std::path::PathBuf;

/// What went wrong starting, reaching or stopping a sandbox. The
/// commands to use instead (`sifbox start`, `exec --detach`) are the
/// CLI's to say.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox {0:?}: no such sandbox is running")]
    NoSuchSandbox(String),
    #[error("sandbox {0:?}: it has stopped (its supervisor is gone)")]
    SupervisorGone(String),
    #[error("sandbox {0:?}: bad state")]
    BadState(String),
    /// A one-shot run's sandbox, which ends with its command: no exec.
    #[error("sandbox {0:?}: it belongs to a one-shot run, which ends with its command")]
    OneShot(String),
    #[error("exec id {0:?}: not the id of a detached exec (letters and digits)")]
    BadExecId(String),
    #[error("exec {id} of sandbox {name}: no such detached exec")]
    NoSuchExec { id: String, name: String },
    #[error("the overlay directory {}: {problem}; pass a directory of your own on a local file system", .dir.display())]
    OverlayDir {
        dir: PathBuf,
        problem: OverlayProblem,
    },
    /// This host (or caller) cannot make a disk-backed layer: `why`.
    #[error("a disk-backed writable layer of {size_mib} MiB: {why}")]
    DiskUnavailable { size_mib: u64, why: String },
    #[error("a disk-backed layer was given for a sandbox whose writable layer is not one")]
    DiskLayerNotWanted,
    #[error("pid {0} out of range")]
    PidOutOfRange(u32),
    #[error("supervisor pipes missing")]
    PipesMissing,
    #[error("sandbox {0}: the supervisor exited during setup")]
    ExitedDuringSetup(String),
    #[error("sandbox {0}: ready before its id maps were written")]
    ReadyBeforeMapped(String),
    #[error("sandbox {0} was not ready in time; it was removed (give it longer to start)")]
    NotReadyInTime(String),
    #[error("sandbox {0}: unexpected status from its supervisor")]
    UnexpectedStatus(String),
    /// The supervisor refused a request: its message.
    #[error("sandbox {name}: {message}")]
    Refused { name: String, message: String },
    #[error("an unexpected answer: {0}")]
    UnexpectedAnswer(String),
}

impl SandboxError {
    /// Whether the caller's input (a name, an id, a dir) is at fault.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            SandboxError::NoSuchSandbox(_)
                | SandboxError::SupervisorGone(_)
                | SandboxError::BadState(_)
                | SandboxError::OneShot(_)
                | SandboxError::BadExecId(_)
                | SandboxError::NoSuchExec { .. }
                | SandboxError::OverlayDir { .. }
                | SandboxError::DiskUnavailable { .. }
        )
    }
}

/// Why an overlay dir cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OverlayProblem {
    #[error("cannot create it: {0}")]
    Create(std::io::Error),
    #[error("cannot open it: {0}")]
    Open(std::io::Error),
    #[error("cannot stat it: {0}")]
    Stat(std::io::Error),
    #[error("it belongs to uid {0}, who could run what the sandbox writes there")]
    Owner(u32),
    #[error("cannot make it private (0700): {0}")]
    Private(std::io::Error),
    #[error("cannot create {sub}/ in it: {source}")]
    Subdir {
        sub: &'static str,
        source: std::io::Error,
    },
}
