//! Errors of the engine. Each renders as one line: what, where, what to do.

/// An engine error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller gave something unusable (a flag, a file, a name).
    #[error("{what}: {why}; {fix}")]
    BadInput {
        what: String,
        why: String,
        fix: String,
    },
    /// The host does not allow something sifbox needs.
    #[error("{what}: {source}; {fix}")]
    Host {
        what: String,
        source: std::io::Error,
        fix: String,
    },
    /// A file system or process operation on the host failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The sandbox supervisor reported a failure while setting up.
    #[error("{0}")]
    Setup(String),
    /// The supervisor stopped answering or said something unexpected.
    #[error("sandbox {name}: {why}")]
    Protocol { name: String, why: String },
    #[error(transparent)]
    Sys(#[from] sifbox_sys::Error),
}

/// Engine result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: impl Into<std::io::Error>) -> Error {
        Error::Io {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// Shorthand to attach context to I/O results.
pub trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<std::io::Error>> IoContext<T> for std::result::Result<T, E> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(what(), e))
    }
}
