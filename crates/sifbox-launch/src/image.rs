//! The image of a command, by the one rule of `sifbox_registry::resolve`:
//! `--rootfs DIR` or IMAGE for a sandbox, a reference for a Dockerfile's
//! `FROM` or a task's `docker_image`. The store opens only when needed.

use std::path::Path;
use std::sync::Arc;

use sifbox_image::store::{Digest, Store};
use sifbox_registry::{ImageArg, Progress, ResolveError, ResolveOptions, Resolved};

use crate::error::LaunchError;

/// The image of a sandbox command: `--rootfs DIR` (a directory) or the
/// IMAGE argument, exactly one of them; pulls report to `progress`.
pub fn for_sandbox(
    rootfs: Option<&Path>,
    image: Option<&str>,
    progress: Arc<dyn Progress>,
) -> Result<Resolved, LaunchError> {
    match (rootfs, image) {
        (Some(dir), None) => {
            if !dir.is_dir() {
                return Err(LaunchError::RootfsMissing {
                    dir: dir.to_path_buf(),
                });
            }
            resolve(&dir.to_string_lossy(), progress)
        }
        (None, Some(i)) => resolve(i, progress),
        _ => Err(LaunchError::NotOneImage),
    }
}

/// An IMAGE argument of a command: `docker://REF` pulled the first time, a
/// rootfs directory in place, a file imported once, else a store name.
pub fn resolve(arg: &str, progress: Arc<dyn Progress>) -> Result<Resolved, LaunchError> {
    let parsed = ImageArg::from_cli(arg)?;
    if let Some(tree) = parsed.tree()? {
        return Ok(Resolved::in_place(tree, arg));
    }
    let store = crate::store::open()?;
    let opts = ResolveOptions {
        progress,
        ..ResolveOptions::default()
    };
    Ok(sifbox_registry::resolve::resolve(
        &store, &parsed, arg, &opts,
    )?)
}

/// A Dockerfile's `FROM` or a task's `docker_image` in `store`: a store
/// name, else a registry reference pulled on first use.
pub fn reference(
    store: &Store,
    reference: &str,
    progress: Arc<dyn Progress>,
) -> Result<Digest, ResolveError> {
    let opts = ResolveOptions {
        progress,
        ..ResolveOptions::default()
    };
    sifbox_registry::resolve::reference(store, reference, &opts)
}
