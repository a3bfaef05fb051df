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
    /// A step of setting up a sandbox failed in a system call: which step
    /// (`step`, naming what it did it on) and the errno.
    #[error("{step}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Syscall { step: String, errno: i32 },
    /// The sandbox supervisor reported a failure while setting up (one that
    /// is not a system call's).
    #[error("{0}")]
    Setup(String),
    /// The supervisor stopped answering or said something unexpected.
    #[error("sandbox {name}: {why}")]
    Protocol { name: String, why: String },
    #[error(transparent)]
    Sys(#[from] sifbox_sys::Error),
    /// Assembling the sandbox's root failed.
    #[error(transparent)]
    Rootfs(#[from] crate::rootfs::RootfsError),
    /// Writing an id map failed.
    #[error(transparent)]
    IdMap(#[from] crate::idmap::IdMapError),
    /// init (the sandbox's PID 1) failed to set the sandbox up.
    #[error(transparent)]
    Init(#[from] crate::supervisor::InitError),
    /// The outer supervisor failed to set the sandbox up.
    #[error(transparent)]
    Outer(#[from] crate::supervisor::OuterError),
}

/// Engine result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The failed step of setting up, with the errno `e`.
    pub fn syscall(step: impl Into<String>, e: rustix::io::Errno) -> Error {
        Error::Syscall {
            step: step.into(),
            errno: e.raw_os_error(),
        }
    }

    /// The errno of a failed system call, where the error is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Syscall { errno, .. } => Some(*errno),
            Error::Rootfs(e) => e.errno(),
            Error::IdMap(crate::idmap::IdMapError::Write { errno, .. }) => {
                Some(errno.raw_os_error())
            }
            Error::Host { source, .. } | Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The one line the supervisor sends its client for this error
    /// (`errno=N STEP` for a failed system call), read back by
    /// [`Error::from_status`].
    pub(crate) fn status_line(&self) -> String {
        let text = match self {
            Error::Syscall { step, errno } => format!("errno={errno} {step}"),
            Error::Rootfs(e) => match e.step_errno() {
                Some((step, errno)) => format!("errno={errno} {step}"),
                None => e.to_string(),
            },
            other => other.to_string(),
        };
        text.replace('\n', " ")
    }

    /// The error a supervisor's `error ...` status line stands for.
    pub(crate) fn from_status(msg: &str) -> Error {
        if let Some((n, step)) = msg
            .strip_prefix("errno=")
            .and_then(|rest| rest.split_once(' '))
        {
            if let Ok(errno) = n.parse() {
                return Error::Syscall {
                    step: step.to_string(),
                    errno,
                };
            }
        }
        Error::Setup(msg.to_string())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_syscall_crosses_the_status_pipe_with_its_errno() {
        let e = Error::syscall("mounting proc at /proc", rustix::io::Errno::PERM);
        assert_eq!(e.errno(), Some(libc_eperm()));
        let back = Error::from_status(&e.status_line());
        assert!(matches!(&back, Error::Syscall { step, .. } if step == "mounting proc at /proc"));
        assert_eq!(back.errno(), e.errno());
        assert_eq!(back.to_string(), e.to_string());
        assert!(e.to_string().starts_with("mounting proc at /proc: "), "{e}");
        // Anything else stays text.
        let other = Error::from_status("the client went away during setup");
        assert!(matches!(other, Error::Setup(_)));
        assert_eq!(Error::from_status("errno=x y").to_string(), "errno=x y");
    }

    fn libc_eperm() -> i32 {
        rustix::io::Errno::PERM.raw_os_error()
    }
}
