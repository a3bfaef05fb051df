//! Why the runtime dir or a sandbox's place in it is unusable (a leaf).

use std::path::PathBuf;

/// The fix for a runtime dir that cannot be used.
pub(super) const SET_RUNTIME: &str =
    "set SIFBOX_RUNTIME to a writable directory of your own on a local file system";

/// What is wrong with the runtime dir, or with a sandbox's place in it.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The dir the caller named (`from`: the variable that named it).
    #[error("runtime dir {} (from {from}): {problem}; {SET_RUNTIME}", .path.display())]
    Named {
        path: PathBuf,
        from: String,
        problem: DirProblem,
    },
    #[error("runtime dir {} (from XDG_RUNTIME_DIR): {source}; {SET_RUNTIME}", .path.display())]
    Xdg {
        path: PathBuf,
        source: std::io::Error,
    },
    /// No default dir (XDG_RUNTIME_DIR unset) is the caller's alone.
    #[error("runtime dir {} (XDG_RUNTIME_DIR is unset): {problem}; set XDG_RUNTIME_DIR (or SIFBOX_RUNTIME) to a directory of your own, or have the owner of the directories named remove them", .first.display())]
    Default { first: PathBuf, problem: DirProblem },
    #[error("sandbox name {0:?}: a sandbox of that name is running; choose another name, or stop that sandbox first")]
    NameTaken(String),
    #[error("the runtime dir {} is not the one the sandbox was started in (something swapped it)", .0.display())]
    Swapped(PathBuf),
    #[error("{}: locked by another", .0.display())]
    LockedByAnother(PathBuf),
    #[error("{}: taken by a remover", .0.display())]
    TakenByRemover(PathBuf),
    #[error("{}: not the lock its client made (the client went away, and the name was taken)", .0.display())]
    NotOurLock(PathBuf),
    #[error("creating {}/sandboxes: {source}", .path.display())]
    Sandboxes {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl RuntimeError {
    /// Whether the caller's choice (a dir, a name) is at fault.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            RuntimeError::Named { .. }
                | RuntimeError::Xdg { .. }
                | RuntimeError::Default { .. }
                | RuntimeError::NameTaken(_)
        )
    }
}

/// Why a runtime dir cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DirProblem {
    #[error("cannot create it: {0}")]
    Create(std::io::Error),
    #[error("cannot open it: {0}")]
    Open(std::io::Error),
    #[error("{0}")]
    Stat(std::io::Error),
    #[error("it belongs to uid {0}, not to you")]
    Owner(u32),
    #[error("it is writable by others")]
    WritableByOthers,
    #[error("not writable: {0}")]
    NotWritable(std::io::Error),
    /// Its `sandboxes` dir could not be made.
    #[error("{0}")]
    Unusable(Box<RuntimeError>),
    #[error("cannot open {}: {source}", .base.display())]
    Base {
        base: PathBuf,
        source: std::io::Error,
    },
    /// Each refused candidate, with why.
    #[error("none of it and its {fallbacks} fallbacks is yours alone: {}", .refused.join("; "))]
    NoneOurs {
        fallbacks: usize,
        refused: Vec<String>,
    },
}
