//! Why the scratch dir or a disk-backed layer is unusable (a leaf).

use std::path::PathBuf;

/// What is wrong with the scratch dir, or with making a disk-backed layer.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("the scratch directory {}: cannot make it: {source}; set SIFBOX_SCRATCH to a directory of your own on a local disk", .dir.display())]
    ScratchParent {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// A directory above it, or it, may be swapped by another user.
    #[error("the scratch directory {}: {source}; set SIFBOX_SCRATCH to a directory of your own (mode 0700) on a local disk", .dir.display())]
    ScratchAncestors {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the scratch directory {}: {why}; set SIFBOX_SCRATCH to a directory of your own (mode 0700) on a local disk", .dir.display())]
    ScratchNotPrivate { dir: PathBuf, why: String },
    #[error("the scratch directory {}: cannot make or open it: {source}; set SIFBOX_SCRATCH to a directory of your own (mode 0700) on a local disk", .dir.display())]
    ScratchOpen {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// `place`: the layer or template being made.
    #[error("{place}: making a nameless file (O_TMPFILE): {source}; put SIFBOX_SCRATCH on a local ext4 or xfs")]
    Nameless {
        place: String,
        source: std::io::Error,
    },
    /// mkfs.ext4 failed (`why`: its status and output).
    #[error("{place}: {why}")]
    Format { place: String, why: String },
    #[error("the disk-backed file system: the layer {0} has not been removed")]
    LayerNotRemoved(String),
}

impl DiskError {
    /// Whether the caller's scratch dir is at fault.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            DiskError::ScratchParent { .. }
                | DiskError::ScratchAncestors { .. }
                | DiskError::ScratchNotPrivate { .. }
                | DiskError::ScratchOpen { .. }
        )
    }
}
