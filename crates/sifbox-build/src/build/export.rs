//! Exporting the target stage to the store as an image, cached by its
//! file system state and config.

use std::time::Instant;

use sifbox_image::store::{Digest, Reuse};

use super::{hash_json, Builder, StageResult};
use crate::error::Result;
use crate::layers::chain_key;
use crate::steps;

impl Builder<'_> {
    /// Turns the target stage into a store image (cached by its state and
    /// config).
    pub(super) fn export(&mut self, target: &StageResult) -> Result<(Digest, bool)> {
        self.check_interrupted()?;
        let meta = target.meta.clone();
        let key = chain_key(&target.state.key, &format!("IMAGE\n{}", hash_json(&meta)));
        let reuse = if self.opts.no_cache {
            Reuse::Refresh
        } else {
            Reuse::Yes
        };
        self.store.make_once(&format!("build:{key}"), reuse, || {
            let started = Instant::now();
            self.progress.note("exporting the image");
            let clamp = sifbox_image::squash::PackOptions::from_env().clamp_mtime;
            let d = steps::export(&self.layers, &target.state, &meta, clamp)?;
            self.progress.done(false, started.elapsed());
            Ok(d)
        })
    }
}
