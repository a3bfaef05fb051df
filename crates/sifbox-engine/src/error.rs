//! Errors of the engine. Each renders as one line: what, where, what to do.
//!
//! Each module has an error enum whose variants carry the data (path,
//! field, limit, errno), rolled up here by `#[from]`. The engine says what
//! went wrong; advice naming a command's flags is the CLI's to give (it
//! matches on these variants).

//!
//! The enums live in leaf files (`spec/error.rs`, `runtime/error.rs`, ...)
//! that use nothing of this file, so this file is imported by every
//! module and imports none of them.

pub use crate::aio::error::AioError;
pub use crate::disk::error::DiskError;
pub use crate::evidence::error::EvidenceError;
use crate::idmap::error::IdMapError;
use crate::rootfs::error::RootfsError;
pub use crate::runtime::error::RuntimeError;
pub use crate::sandbox::error::SandboxError;
pub use crate::spec::error::SpecError;
pub use crate::supervisor::error::SupervisorError;
use crate::supervisor::error::{InitError, OuterError};

/// An engine error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sandbox description (spec, bind, env, limit, name) is unusable.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The runtime dir or a sandbox's name in it.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The logs dir or a sandbox.json.
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    /// The scratch dir or a disk-backed writable layer.
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// Starting, reaching or stopping a sandbox.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A misuse of the async API.
    #[error(transparent)]
    Aio(#[from] AioError),
    /// The supervisor's side of a launch, or the failure it reported.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
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
    /// The supervisor stopped answering or said something unexpected.
    #[error("sandbox {name}: {why}")]
    Protocol { name: String, why: String },
    #[error(transparent)]
    Sys(#[from] sifbox_sys::Error),
    /// Assembling the sandbox's root failed.
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// Writing an id map failed.
    #[error(transparent)]
    IdMap(#[from] IdMapError),
    /// init (the sandbox's PID 1) failed to set the sandbox up.
    #[error(transparent)]
    Init(#[from] InitError),
    /// The outer supervisor failed to set the sandbox up.
    #[error(transparent)]
    Outer(#[from] OuterError),
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
            Error::IdMap(IdMapError::Write { errno, .. }) => Some(errno.raw_os_error()),
            Error::Host { source, .. } | Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Whether the caller's input is at fault (a flag, a file, a name, a
    /// directory it chose) rather than the host or sifbox.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Spec(_) => true,
            Error::IdMap(e) => e.is_bad_input(),
            Error::Aio(e) => e.is_bad_input(),
            Error::Runtime(e) => e.is_bad_input(),
            Error::Evidence(e) => e.is_bad_input(),
            Error::Disk(e) => e.is_bad_input(),
            Error::Sandbox(e) => e.is_bad_input(),
            _ => false,
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
        SupervisorError::Reported {
            message: msg.to_string(),
        }
        .into()
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
        assert!(matches!(
            other,
            Error::Supervisor(SupervisorError::Reported { .. })
        ));
        assert_eq!(Error::from_status("errno=x y").to_string(), "errno=x y");
    }

    #[test]
    fn the_typed_errors_name_what_they_carry() {
        use std::path::PathBuf;
        let e = Error::from(SpecError::ZeroLimit(crate::spec::error::Limit::Pids));
        assert_eq!(
            e.to_string(),
            "pids limit 0: a sandbox needs at least one process; give a number such as 4096"
        );
        assert!(e.is_bad_input());
        let e = Error::from(SpecError::SwapBelowMemory {
            memory: 512,
            total: 256,
        });
        assert!(
            e.to_string()
                .contains("(256 bytes) is less than the memory limit (512 bytes)"),
            "{e}"
        );
        let e = Error::from(SpecError::EnvFileLine {
            path: PathBuf::from("/x/env"),
            line: 3,
            why: "no '='".into(),
        });
        assert!(e.to_string().starts_with("/x/env:3: no '='; "), "{e}");
        let e = Error::from(RuntimeError::Named {
            path: PathBuf::from("/r"),
            from: "SIFBOX_RUNTIME".into(),
            problem: crate::runtime::error::DirProblem::Owner(7),
        });
        assert_eq!(
            e.to_string(),
            "runtime dir /r (from SIFBOX_RUNTIME): it belongs to uid 7, not to you; set \
             SIFBOX_RUNTIME to a writable directory of your own on a local file system"
        );
        assert!(e.is_bad_input());
        let e = Error::from(RuntimeError::NotOurLock(PathBuf::from("/r/s/lock")));
        assert!(!e.is_bad_input(), "{e}");
        let e = Error::from(EvidenceError::SubdirNotDir {
            path: PathBuf::from("/logs"),
            sub: "agent",
            source: std::io::Error::from_raw_os_error(20),
        });
        let text = e.to_string();
        assert!(
            text.starts_with("logs dir /logs: agent in it is not a directory ("),
            "{text}"
        );
        assert!(
            text.ends_with("; remove /logs/agent, or pass another logs dir"),
            "{text}"
        );
        let e = Error::from(DiskError::ScratchOpen {
            dir: PathBuf::from("/s"),
            source: std::io::Error::from_raw_os_error(13),
        });
        assert!(
            e.is_bad_input() && e.to_string().contains("/s: cannot make or open it"),
            "{e}"
        );
        assert!(!Error::from(DiskError::LayerNotRemoved("s1".into())).is_bad_input());
        let e = Error::from(SandboxError::DiskUnavailable {
            size_mib: 64,
            why: "no loop".into(),
        });
        assert_eq!(
            e.to_string(),
            "a disk-backed writable layer of 64 MiB: no loop",
            "{e}"
        );
        // No engine message names a command's flag: that advice is the CLI's.
        for e in [
            Error::from(SandboxError::BadExecId("x".into())),
            Error::from(SandboxError::OneShot("b".into())),
            Error::from(SandboxError::NoSuchSandbox("b".into())),
        ] {
            assert!(!e.to_string().contains("--"), "{e}");
        }
        assert!(!Error::from(AioError::NotReadyInTime { name: "b".into() }).is_bad_input());
        assert!(Error::from(AioError::Tty).is_bad_input());
    }

    fn libc_eperm() -> i32 {
        rustix::io::Errno::PERM.raw_os_error()
    }
}
