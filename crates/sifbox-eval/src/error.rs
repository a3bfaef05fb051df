//! Errors of a job. Each renders as one line: what, where, what to do.

/// An error that stops a job (a rollout's own failures are results, not
/// errors).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The caller gave something unusable: a task dir, a task.toml, a flag.
    #[error("{what}: {why}; {fix}")]
    BadInput {
        what: String,
        why: String,
        fix: String,
    },
    /// A file system operation on the host failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] sifbox_engine::Error),
}

/// Eval result.
pub type Result<T, E = EvalError> = std::result::Result<T, E>;

impl EvalError {
    pub fn bad(what: impl Into<String>, why: impl Into<String>, fix: impl Into<String>) -> Self {
        EvalError::BadInput {
            what: what.into(),
            why: why.into(),
            fix: fix.into(),
        }
    }

    pub fn io(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        EvalError::Io {
            what: what.into(),
            source: source.into(),
        }
    }

    /// Whether the caller's input is at fault (exit 125).
    pub fn is_bad_input(&self) -> bool {
        match self {
            EvalError::BadInput { .. } => true,
            EvalError::Engine(e) => e.is_bad_input(),
            _ => false,
        }
    }
}
