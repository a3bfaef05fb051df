//! The errors of assembling a sandbox: each variant carries what went
//! wrong (the file, the key, the path); the transparent ones keep the
//! library's own error, and its source chain, up to the CLI.

use std::path::PathBuf;

use sifbox_image::store::StoreError;
use sifbox_registry::ResolveError;

/// Why a sandbox could not be assembled, or its image found.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A value of the config file that sifbox cannot use.
    #[error("{key} = {value} in {}: {why}; {fix}", file.display())]
    Config {
        file: PathBuf,
        key: String,
        value: String,
        why: String,
        fix: String,
    },
    /// An environment variable sifbox reads holds something unusable.
    #[error("{var}={value}: {why}; {fix}")]
    Env {
        var: &'static str,
        value: String,
        why: &'static str,
        fix: &'static str,
    },
    /// The host's CA bundle to show is not a file.
    #[error("--host-ca {}: no such file; pass the host's CA bundle file (--host-ca=FILE), or --host-ca alone for /etc/ssl/certs/ca-certificates.crt", path.display())]
    HostCaMissing { path: PathBuf },
    /// `--rootfs DIR` is not a directory.
    #[error("--rootfs {}: no such directory; pass an unpacked root file system directory, or an IMAGE without --rootfs", dir.display())]
    RootfsMissing { dir: PathBuf },
    /// Neither or both of IMAGE and `--rootfs`.
    #[error("image: give exactly one image (IMAGE or --rootfs DIR); e.g. --rootfs ./rootfs, or an image name from `sifbox image ls`")]
    NotOneImage,
    /// The overlay dir is inside the image it would cover.
    #[error("--overlay {}: it lies inside the image; choose a directory outside the root file system", dir.display())]
    OverlayInsideImage { dir: PathBuf },
    /// The owner of the logs subdirs is no user of the image.
    #[error("--logs-owner {owner}: cannot give /logs/{sub} to it: {source}; name a user of the image (--logs-owner NAME|UID[:GID]), or leave the logs dir to root")]
    LogsOwner {
        owner: String,
        sub: &'static str,
        source: Box<sifbox_engine::Error>,
    },
    /// Locating the sifbox binary, which serves as the supervisor.
    #[error("locating the sifbox binary: {0}")]
    Exe(#[source] std::io::Error),
    #[error(transparent)]
    Engine(#[from] sifbox_engine::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
}

impl LaunchError {
    /// What to do, where the message does not say it already.
    pub fn fix(&self) -> Option<String> {
        match self {
            LaunchError::Store(e) => e.fix(),
            LaunchError::Resolve(e) => Some(e.fix()),
            _ => None,
        }
    }
}
