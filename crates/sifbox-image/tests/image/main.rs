//! The integration tests of sifbox-image, one binary: a module per suite,
//! and the helpers they share (`layer_util`: tar layers built in memory;
//! `sif_util`: trees to pack, snapshots to compare).

mod layer_util;
mod sif_util;

mod layer_apply;
mod layer_image;
mod layer_interop;
mod layer_proptest;
mod layer_truncated;
mod sif_determinism;
mod sif_interop;
mod sif_malformed;
mod squash_blocks;
mod squash_remix;
mod squash_verify;
