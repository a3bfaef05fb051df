//! Image sources made of layers: a rootfs tarball, an OCI image layout
//! (directory or `oci-archive` tar) and a `docker save` archive.
//!
//! [`Image::open`] reads the source's metadata (for an archive, after
//! extracting it into a scratch directory that is removed when the
//! [`Image`] is dropped), picks the manifest for the wanted platform, and
//! lists the layers in order. [`Image::verify`] checks every blob against
//! its digest (and, for docker-archives, every layer against the config's
//! `diff_ids`) before anything is written; [`Image::apply`] applies the
//! layers and checks the digests again while reading. [`unpack_image`] does
//! all three.

mod archive;
mod model;
mod source;

use std::path::PathBuf;

use super::ApplyOptions;
pub use model::{
    BlobDescriptor, ImageConfig, Manifest, Platform, SourceKind, MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
};
pub use source::{unpack_image, Image, LayerBlob, Unpacked};

/// How an import goes.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Platform to pick from a multi-platform index; default: the host's.
    /// An image with a single manifest is taken whatever its platform unless
    /// this is set.
    pub platform: Option<Platform>,
    /// Picks one image in a source holding several: matched against
    /// `org.opencontainers.image.ref.name` / `io.containerd.image.name`
    /// annotations (OCI) or `RepoTags` (docker-archive), exactly or as the
    /// end after a `/`.
    pub reference: Option<String>,
    /// How layers are applied.
    pub apply: ApplyOptions,
    /// Where an archive is extracted while importing; default: the system
    /// temp dir.
    pub tmp_dir: Option<PathBuf>,
}
