//! Errors of a build. Each renders as one line: what, where, what to do.

use std::path::{Path, PathBuf};

/// A build error.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The caller gave something unusable (a flag, a file, a context).
    #[error("{what}: {why}; {fix}")]
    BadInput {
        what: String,
        why: String,
        fix: String,
    },
    /// An instruction of the Dockerfile is wrong or cannot be done; cites
    /// FILE:LINE and the instruction.
    #[error("{file}:{line}: {instruction}: {message}")]
    Instruction {
        file: String,
        line: usize,
        instruction: String,
        message: String,
    },
    /// A `RUN` step failed: its exit code and the last lines of its output.
    #[error("{file}:{line}: {instruction}: the command exited with code {code}{tail}")]
    RunFailed {
        file: String,
        line: usize,
        instruction: String,
        code: i32,
        /// The last lines of output, already formatted (empty when none).
        tail: String,
    },
    /// Something failed while a step ran (not the caller's input): the
    /// error, citing the step.
    #[error("{0}")]
    StepFailed(Box<BuildError>),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] sifbox_engine::Error),
    #[error(transparent)]
    Store(#[from] sifbox_image::store::StoreError),
    #[error(transparent)]
    Import(#[from] sifbox_image::import::ImportError),
}

/// Build result.
pub type Result<T, E = BuildError> = std::result::Result<T, E>;

impl BuildError {
    pub fn io(path: &Path, source: impl Into<std::io::Error>) -> BuildError {
        BuildError::Io {
            path: path.to_path_buf(),
            source: source.into(),
        }
    }

    pub fn bad(what: impl Into<String>, why: impl Into<String>, fix: impl Into<String>) -> Self {
        BuildError::BadInput {
            what: what.into(),
            why: why.into(),
            fix: fix.into(),
        }
    }

    /// Whether the caller's input is at fault (exit 125) rather than a step
    /// that ran and failed (exit 1).
    /// Whether a build step's own command failed (exit status 1 of
    /// `sifbox build`); every other error is sifbox's (125).
    pub fn is_step_failure(&self) -> bool {
        matches!(self, BuildError::RunFailed { .. })
    }

    pub fn is_bad_input(&self) -> bool {
        match self {
            BuildError::BadInput { .. } | BuildError::Instruction { .. } => true,
            BuildError::Engine(e) => matches!(e, sifbox_engine::Error::BadInput { .. }),
            _ => false,
        }
    }
}
