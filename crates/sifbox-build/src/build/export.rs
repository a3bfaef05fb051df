//! Exporting the target stage to the store as an image, cached by its
//! file system state and config.

use std::time::Instant;

use sifbox_image::store::Digest;

use super::{hash_json, Builder, StageResult};
use crate::error::Result;
use crate::layers::chain_key;
use crate::steps;

impl Builder<'_> {
    /// Turns the target stage into a store image (cached by its state and
    /// config).
    pub(super) fn export(&mut self, target: &StageResult) -> Result<(Digest, bool)> {
        let meta = target.meta.clone();
        let key = chain_key(&target.state.key, &format!("IMAGE\n{}", hash_json(&meta)));
        let source_key = format!("build:{key}");
        let _lock = self.store.lock(&format!("build-image-{key}"))?;
        if !self.opts.no_cache {
            if let Some(d) = self.store.recall_source(&source_key) {
                if self.store.sif_path(&d).is_file() {
                    return Ok((d, true));
                }
            }
        }
        let started = Instant::now();
        self.progress.note("exporting the image");
        let clamp = sifbox_image::squash::PackOptions::from_env().clamp_mtime;
        let d = steps::export(&self.layers, &target.state, &meta, clamp)?;
        self.store.remember_source(&source_key, &d)?;
        self.progress.done(false, started.elapsed());
        Ok((d, false))
    }
}
