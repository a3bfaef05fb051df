//! What stops a rollout's phase that is sifbox's or the host's doing (an
//! infrastructure error, recorded in its result.json): typed, with the
//! path or the sandbox's error it failed on.

use std::path::PathBuf;

/// A failed step of a rollout that is not the task's or the agent's.
#[derive(Debug, thiserror::Error)]
pub(super) enum RolloutError {
    /// A file or dir of the host (the job's, the task's, a lock's).
    #[error("{}{}: {source}", .action.prefix(), .path.display())]
    Host {
        action: HostAction,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A transfer into the sandbox, or another request to it.
    #[error(transparent)]
    Sandbox(#[from] sifbox_engine::Error),
    /// A task's file, opened beneath its dir (the error names it).
    #[error(transparent)]
    TaskFile(std::io::Error),
    /// The job was cancelled while the rollout waited for `host_lock`.
    #[error("interrupted while waiting for host_lock")]
    LockInterrupted,
}

/// What was being done to a host path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HostAction {
    /// Reading or making it (the path says which).
    Using,
    Creating,
    Opening,
    Locking,
}

impl HostAction {
    fn prefix(self) -> &'static str {
        match self {
            HostAction::Using => "",
            HostAction::Creating => "creating ",
            HostAction::Opening => "opening ",
            HostAction::Locking => "locking ",
        }
    }
}

impl RolloutError {
    /// A failed operation on the host path `path`.
    pub(super) fn host(
        action: HostAction,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> RolloutError {
        let path = path.to_path_buf();
        move |source| RolloutError::Host {
            action,
            path,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_error_names_the_path_and_what_was_done() {
        let e = RolloutError::host(HostAction::Locking, "/store/locks/eval-db".as_ref())(
            std::io::Error::from_raw_os_error(9),
        );
        let text = e.to_string();
        assert!(text.starts_with("locking /store/locks/eval-db: "), "{text}");
        assert!(text.contains("(os error 9)"), "{text}");
        let e = RolloutError::host(HostAction::Using, "/job/.steps".as_ref())(
            std::io::Error::from_raw_os_error(13),
        );
        assert!(e.to_string().starts_with("/job/.steps: "), "{e}");
        assert_eq!(
            RolloutError::LockInterrupted.to_string(),
            "interrupted while waiting for host_lock"
        );
    }
}
