//! Why a logs dir or a sandbox.json is unusable (a leaf).

use std::path::PathBuf;

/// What is wrong with a logs dir or a sandbox.json.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("{}: not a sandbox.json: {source}; leave sandbox.json as sifbox wrote it", .path.display())]
    NotEvidence {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("logs dir {}: cannot create it: {source}; pass a directory you can write", .path.display())]
    LogsCreate {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("logs dir {}: cannot open it: {source}; pass a directory you can read", .path.display())]
    LogsOpen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("logs dir {}: cannot make it {mode:04o} ({source}); pass a directory of yours", .path.display())]
    LogsMode {
        path: PathBuf,
        mode: u32,
        source: std::io::Error,
    },
    /// A subdir (`agent`, `verifier`, `artifacts`) cannot be made.
    #[error("logs dir {}: cannot create {sub}/ in it: {source}; remove {}, or pass another logs dir", .path.display(), .path.join(sub).display())]
    SubdirCreate {
        path: PathBuf,
        sub: &'static str,
        source: std::io::Error,
    },
    /// A subdir is a symlink or a file (left by an earlier sandbox?).
    #[error("logs dir {}: {sub} in it is not a directory ({source}): a symlink or a file, left by an earlier sandbox?; remove {}, or pass another logs dir", .path.display(), .path.join(sub).display())]
    SubdirNotDir {
        path: PathBuf,
        sub: &'static str,
        source: std::io::Error,
    },
    #[error("logs dir {}: {sub}/ in it is open to other users and cannot be made {mode:04o} ({source}); remove {}, or pass another logs dir", .path.display(), .path.join(sub).display())]
    SubdirOpen {
        path: PathBuf,
        sub: &'static str,
        mode: u32,
        source: std::io::Error,
    },
}

impl EvidenceError {
    /// Whether the caller's logs dir (or file) is at fault.
    pub fn is_bad_input(&self) -> bool {
        true
    }
}
