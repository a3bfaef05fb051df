//! Why assembling a sandbox's root failed: the step, the path and the
//! errno, as data.

use std::path::PathBuf;

use rustix::io::Errno;
use sifbox_sys::syscall::FsError;

/// An error of root assembly. Every variant names its step (what was
/// being done, on which path as the sandbox sees it).
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// A system call of `step` failed.
    #[error("{step}: {}", std::io::Error::from(*.errno))]
    Syscall { step: String, errno: Errno },
    /// Making a file system for `step` failed (with the kernel's log).
    #[error("{step}: {source}")]
    Fs { step: String, source: FsError },
    /// A path beneath one of sifbox's mounts that was not made.
    #[error("{path}: the mount it lies in was not made")]
    NoMount { path: String },
    /// A path with no last name to create (`/`, `..`).
    #[error("{path}: not a creatable name")]
    NotCreatable { path: String },
    /// The image's directory where sifbox mounts its own is a symlink or
    /// not a directory.
    #[error("the image's {path} {why}: sifbox mounts its own {mount} there and does not follow a path the image chose; rebuild the image with {at} as an empty directory (for a root file system directory ROOT: rm ROOT{path} && mkdir ROOT{path})")]
    NotARealDir {
        path: String,
        why: String,
        mount: String,
        at: String,
    },
    /// Following the image's symlinks to create a path went round.
    #[error("creating {path} in the sandbox: too many levels of symbolic links")]
    TooManyLinks { path: String },
    /// An `IfPresent` target was gone when a bind needed it.
    #[error("{step}: nowhere to attach it")]
    NowhereToAttach { step: String },
    /// A [`super::Step::LayerDir`] without a writable layer.
    #[error("{step}: no writable layer")]
    NoLayer { step: String },
    /// A guarded bind's source is not a directory.
    #[error("{step}: {} is not a directory", .src.display())]
    NotADirectory { step: String, src: PathBuf },
    /// Writing a file of the sandbox's own failed.
    #[error("{step}: {source}")]
    Write {
        step: String,
        source: std::io::Error,
    },
    /// [`crate::spec::Writable::Disk`] without the disk outer makes.
    #[error("the disk-backed writable layer was not made")]
    NoDisk,
    /// The overlay options hold a NUL (a layer path with one).
    #[error("a NUL in the overlay options")]
    OverlayNul,
    /// Every way of mounting the overlay root failed; `source` is the
    /// last one's error.
    #[error("mounting the overlay root (image {}): {source}; run `sifbox doctor` to see whether overlayfs works in a user namespace here", .image.display())]
    Overlay {
        image: PathBuf,
        source: Box<RootfsError>,
    },
}

impl RootfsError {
    /// The failed step and its errno, where a system call failed.
    pub fn step_errno(&self) -> Option<(String, i32)> {
        match self {
            RootfsError::Syscall { step, errno } => Some((step.clone(), errno.raw_os_error())),
            RootfsError::Fs { step, source } => {
                let shown = source.to_string();
                let without_errno = shown
                    .strip_suffix(&format!(": {}", std::io::Error::from(source.errno)))
                    .unwrap_or(&shown);
                Some((
                    format!("{step}: {without_errno}"),
                    source.errno.raw_os_error(),
                ))
            }
            _ => None,
        }
    }

    /// The errno, where a system call failed.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RootfsError::Syscall { errno, .. } => Some(errno.raw_os_error()),
            RootfsError::Fs { source, .. } => Some(source.errno.raw_os_error()),
            RootfsError::Write { source, .. } => source.raw_os_error(),
            RootfsError::Overlay { source, .. } => source.errno(),
            _ => None,
        }
    }
}

/// The error of `step` failing with an errno.
pub(super) fn sys_err(step: impl std::fmt::Display) -> impl FnOnce(Errno) -> RootfsError {
    move |errno| RootfsError::Syscall {
        step: step.to_string(),
        errno,
    }
}

/// Root assembly's result.
pub type Result<T, E = RootfsError> = std::result::Result<T, E>;
