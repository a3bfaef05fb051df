//! Why a supervisor (outer, init) could not set a sandbox up (a leaf).

use std::path::PathBuf;

use crate::protocol::ProtocolError;

/// The supervisor's side of a launch, or the failure a supervisor reported
/// (text: it crossed the status pipe).
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("reading the launch description: {0}")]
    Launch(ProtocolError),
    #[error("the launch came without its runtime dir's descriptor")]
    NoRuntimeDir,
    #[error("the launch came with {count} descriptors (a disk-backed layer given: {disk_given})")]
    Descriptors { count: usize, disk_given: bool },
    #[error("the client went away during setup")]
    ClientGone,
    /// What a supervisor reported on its status pipe or control socket.
    #[error("{message}")]
    Reported { message: String },
}

/// Why init could not set the sandbox up, where no system call of its
/// own failed (those are `Error::Syscall`s naming the step).
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The request for the nested id maps did not reach outer.
    #[error("asking for the nested id maps: {0}")]
    AskMaps(#[source] ProtocolError),
    /// outer did not map the nested user namespace.
    #[error("mapping the sandbox's nested user namespace failed")]
    NotMapped,
    /// The child that makes the guarded mount namespace failed (`why`, as
    /// it sent it) or did not answer.
    #[error("making the guarded mount namespace: {why}")]
    GuardedNamespace { why: String },
}

/// Why the outer supervisor could not set the sandbox up, where no system
/// call of its own failed.
#[derive(Debug, thiserror::Error)]
pub enum OuterError {
    /// The client said it made the disk-backed layer but sent none.
    #[error("the disk-backed layer did not come with the launch")]
    DiskNotSent,
    /// The disk-backed layer needs mkfs.ext4.
    #[error("the disk-backed layer: mkfs.ext4 is not installed")]
    NoMkfs,
    /// Something the sandbox uses is being removed.
    #[error("{}: locked by a remover of what the sandbox uses", .0.display())]
    BeingRemoved(PathBuf),
}
