//! Why an id map could not be made or written (a leaf).

use std::path::PathBuf;

use rustix::io::Errno;

/// Why an id map could not be written.
#[derive(Debug, thiserror::Error)]
pub enum IdMapError {
    /// newuidmap or newgidmap refused the map.
    #[error("{tool} {pid} {args}: {stderr}; check /etc/subuid and /etc/subgid for your user, or map a single id (`--userns single`)")]
    ToolFailed {
        tool: &'static str,
        pid: i32,
        args: String,
        stderr: String,
    },
    /// Writing a map file (`/proc/PID/uid_map`, ...) failed.
    #[error("writing {}: {}", .path.display(), std::io::Error::from(*.errno))]
    Write { path: PathBuf, errno: Errno },
}
