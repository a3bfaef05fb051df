//! The CLI's one error type. The libraries' errors stay typed up to here
//! (a full disk importing an image reads as a full disk, not as a bad
//! reference); [`CliError::fix`] says what to do and
//! [`CliError::exit_code`] what sifbox exits with.

use sifbox_build::error::BuildError;
use sifbox_eval::EvalError;
use sifbox_image::import::ImportError;
use sifbox_image::store::StoreError;
use sifbox_registry::{PullError, ResolveError};

/// An error of a sifbox command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Engine(#[from] sifbox_engine::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Pull(#[from] PullError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// Whoever read stdout went away (`sifbox ... | head`): the command
    /// stops, quietly, with status 0.
    #[error("stdout was closed")]
    StdoutClosed,
}

/// A command's result.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    /// What to do about it, where the message does not already say.
    pub fn fix(&self) -> Option<String> {
        match self {
            // Their messages carry the fix (`what: why; fix`).
            CliError::Engine(_) | CliError::Eval(_) | CliError::StdoutClosed => None,
            CliError::Store(e) => e.fix(),
            CliError::Import(e) => e.fix(),
            CliError::Resolve(e) => Some(e.fix()),
            CliError::Pull(e) => Some(e.fix()),
            CliError::Build(e) => match e {
                BuildError::Store(s) => s.fix(),
                BuildError::Import(i) => i.fix(),
                _ => None,
            },
        }
    }

    /// The exit status: 125, an error of sifbox itself (see README's exit
    /// codes).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::StdoutClosed => 0,
            _ => crate::EXIT_SIFBOX_ERROR,
        }
    }

    /// The line sifbox prints: the error, then what to do.
    pub fn line(&self) -> String {
        match self.fix() {
            Some(fix) => format!("{self}; {fix}"),
            None => self.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_reads_as_one_and_says_what_to_do() {
        let e = CliError::from(StoreError::Io {
            path: "/store/images".into(),
            source: std::io::Error::from_raw_os_error(28),
        });
        let line = e.line();
        assert!(line.contains("No space left on device"), "{line}");
        assert!(!line.contains("check the reference"), "{line}");
        assert!(line.contains("; "), "{line}");
        assert_eq!(e.exit_code(), 125);
    }
}
