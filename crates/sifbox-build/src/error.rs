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
    #[error("{}{message}", cite(file, *line, instruction))]
    Instruction {
        file: String,
        line: usize,
        instruction: String,
        message: String,
    },
    /// A `RUN` step failed: its exit code and the last lines of its output.
    #[error("{}the command exited with code {code}{tail}", cite(file, *line, instruction))]
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
    /// The build was stopped (see `BuildOptions::interrupted`).
    #[error("the build was interrupted")]
    Interrupted,
    #[error(transparent)]
    Engine(#[from] sifbox_engine::Error),
    #[error(transparent)]
    Store(#[from] sifbox_image::store::StoreError),
    #[error(transparent)]
    Import(#[from] sifbox_image::import::ImportError),
}

/// `FILE:LINE: INSTRUCTION: `, leaving out a line of 0 (an error of the
/// whole file) and an empty instruction.
fn cite(file: &str, line: usize, instruction: &str) -> String {
    let mut s = String::from(file);
    if line > 0 {
        s.push_str(&format!(":{line}"));
    }
    s.push_str(": ");
    if !instruction.is_empty() {
        s.push_str(instruction);
        s.push_str(": ");
    }
    s
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
            BuildError::Engine(e) => e.is_bad_input(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_leave_out_what_is_missing() {
        let e = |line, instruction: &str| BuildError::Instruction {
            file: "Dockerfile".into(),
            line,
            instruction: instruction.into(),
            message: "bad".into(),
        };
        assert_eq!(e(3, "RUN x").to_string(), "Dockerfile:3: RUN x: bad");
        assert_eq!(e(0, "").to_string(), "Dockerfile: bad");
        assert_eq!(e(2, "").to_string(), "Dockerfile:2: bad");
    }
}
