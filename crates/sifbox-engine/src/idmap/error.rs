//! Why an id map could not be made or written (a leaf).

use std::path::PathBuf;

use rustix::io::Errno;

/// Why an id map could not be written.
#[derive(Debug, thiserror::Error)]
pub enum IdMapError {
    /// newuidmap or newgidmap refused the map.
    #[error("{tool} {pid} {args}: {stderr}")]
    ToolFailed {
        tool: &'static str,
        pid: i32,
        args: String,
        stderr: String,
    },
    /// Writing a map file (`/proc/PID/uid_map`, ...) failed.
    #[error("writing {}: {}", .path.display(), std::io::Error::from(*.errno))]
    Write { path: PathBuf, errno: Errno },
    /// The full id mapping needs what this host does not give the caller
    /// (the advice, naming `--userns`, is the CLI's).
    #[error("the full id mapping (subordinate ids): {0}")]
    NoSubids(SubidsMissing),
}

impl IdMapError {
    /// Whether the caller's choice (the full mapping) is at fault.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, IdMapError::NoSubids(_))
    }
}

/// What the full id mapping lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubidsMissing {
    #[error("no range for you in /etc/subuid")]
    Subuid,
    #[error("no range for you in /etc/subgid")]
    Subgid,
    #[error("newuidmap/newgidmap are not installed (Debian package uidmap)")]
    Tools,
    /// One of the two tools (`newuidmap`, `newgidmap`).
    #[error("{0} is not installed")]
    Tool(&'static str),
}
