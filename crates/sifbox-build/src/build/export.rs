//! Exporting the target stage to the store as an image, cached by its
//! file system state and config.

use std::time::Instant;

use sifbox_image::store::{Digest, Reuse};

use super::{hash_json, Builder, StageResult};
use crate::error::{BuildError, Result};
use crate::layers::chain_key;
use crate::steps;

impl Builder<'_> {
    /// Turns the target stage into a store image (cached by its state and
    /// config).
    /// The time no entry of the image may be newer than, so that the same
    /// context on the same base gives the same image whenever it is built:
    /// `SOURCE_DATE_EPOCH` (a `--build-arg`, else the environment, as
    /// BuildKit reads it), else the time of the target stage's base image
    /// (0 for scratch). Files that build steps wrote and context files
    /// newer than it get it; older ones keep theirs.
    fn clamp(&self, target: &StageResult) -> Result<u32> {
        let given = self
            .opts
            .build_args
            .get("SOURCE_DATE_EPOCH")
            .map(|v| ("--build-arg SOURCE_DATE_EPOCH", v.clone()))
            .or_else(|| {
                std::env::var("SOURCE_DATE_EPOCH")
                    .ok()
                    .filter(|v| !v.is_empty())
                    .map(|v| ("SOURCE_DATE_EPOCH", v))
            });
        match given {
            None => Ok(target.time),
            Some((what, v)) => v.trim().parse::<u32>().map_err(|_| {
                BuildError::bad(
                    format!("{what}={v}"),
                    "not a time",
                    "give seconds since 1970 (e.g. $(git log -1 --format=%ct))",
                )
            }),
        }
    }

    pub(super) fn export(&mut self, target: &StageResult) -> Result<(Digest, bool)> {
        self.check_interrupted()?;
        let meta = target.meta.clone();
        let clamp = self.clamp(target)?;
        let key = chain_key(
            &target.state.key,
            &format!("IMAGE\n{}\nclamp {clamp}", hash_json(&meta)),
        );
        let reuse = if self.opts.no_cache {
            Reuse::Refresh
        } else {
            Reuse::Yes
        };
        self.store.make_once(&format!("build:{key}"), reuse, || {
            let started = Instant::now();
            self.progress.note("exporting the image");
            let remixed = match self.remix_base(target) {
                Some(base) => steps::remix(&self.layers, &target.state, base, &meta, clamp)?,
                None => None,
            };
            let d = match remixed {
                Some(d) => d,
                None => steps::export(&self.layers, &target.state, &meta, Some(clamp))?,
            };
            self.progress.done(false, started.elapsed());
            Ok(d)
        })
    }

    /// The stored image the target stage's file system is made from: its
    /// unpacked tree is the state's base, and the state is that tree as it
    /// is (the stage only set metadata: LABEL, ENV, CMD, a WORKDIR that
    /// exists...) or with layers on it, which the export may say as edits
    /// of the image's SIF (`steps::remix`).
    fn remix_base<'t>(&self, target: &'t StageResult) -> Option<&'t Digest> {
        target.image.as_ref().filter(|d| {
            if target.state.layers.is_empty() {
                target.state.key == chain_key("image", d.as_str())
            } else {
                target.state.base == self.store.build_rootfs_path(d)
            }
        })
    }
}
