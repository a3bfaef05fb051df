//! Images for sifbox: the SIF container format, squashfs file systems, OCI
//! and Docker image layers, and the content-addressed store that holds them.
//! Nothing here runs processes in sandboxes.

pub mod dedup;
pub mod import;
pub mod layer;
pub mod meta;
pub mod relink;
pub mod setid;
pub mod sif;
pub mod squash;
pub mod store;

/// A system call on a path that failed: what was done, where, and why
/// (the `Io` error of the SIF and squashfs codecs).
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {}: {source}", path.display())]
pub struct IoAt {
    /// What was being done.
    pub op: &'static str,
    /// Where.
    pub path: std::path::PathBuf,
    /// The system error.
    #[source]
    pub source: std::io::Error,
}
