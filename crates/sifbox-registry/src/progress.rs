//! What a pull reports as it goes ([`Progress`]), apart from the pull and
//! the client that both report to it.

use sifbox_image::layer::BlobDescriptor;

/// How a blob was got.
#[derive(Debug, Clone, PartialEq)]
pub enum BlobOutcome {
    /// Already in the blob cache.
    Cached,
    /// Downloaded (`bytes` of it now; `resumed_from` were there before).
    Downloaded {
        bytes: u64,
        resumed_from: u64,
        seconds: f64,
    },
}

/// What a pull reports as it goes. Every method has an empty default.
pub trait Progress: Send + Sync {
    /// The manifest is resolved: the blobs to get (config first).
    fn resolved(&self, _manifest: &str, _blobs: &[BlobDescriptor]) {}
    /// A download starts (at `resumed_from` when continuing one).
    fn blob_started(&self, _blob: &BlobDescriptor, _resumed_from: u64) {}
    /// Bytes arrived.
    fn blob_bytes(&self, _blob: &BlobDescriptor, _bytes: u64) {}
    /// The server ignored the range asked for: the download starts over.
    fn blob_restarted(&self, _blob: &BlobDescriptor) {}
    /// A blob is in the cache.
    fn blob_finished(&self, _blob: &BlobDescriptor, _outcome: &BlobOutcome) {}
    /// A step after the downloads (unpacking, packing).
    fn step(&self, _message: &str) {}
}

/// A progress sink that says nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {}
