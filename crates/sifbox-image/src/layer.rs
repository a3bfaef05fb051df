//! Image layers and the image sources made of them.
//!
//! A *layer* is a tar stream (plain, gzip or zstd; told apart by its first
//! bytes) applied onto a target directory with OCI/Docker semantics:
//!
//! - `.wh.NAME` removes `NAME` as the lower layers left it; `.wh..wh..opq`
//!   makes its directory opaque (what lower layers put there goes, what this
//!   layer adds stays). A whiteout never removes what the same layer adds, so
//!   the order of entries within the tar does not matter. Other `.wh..wh.*`
//!   names (aufs metadata) are ignored.
//! - Regular files, directories, symlinks (targets stored verbatim and never
//!   followed while extracting), hard links (to entries of this layer or of
//!   earlier ones) and fifos. Modes keep setuid, setgid and sticky bits;
//!   mtimes are kept; a directory gets its mode and mtime after its children
//!   are written, so a `0555` directory still receives its files.
//! - Owners: [`Owners::Caller`] (the default) leaves everything owned by the
//!   extracting user; [`Owners::Keep`] changes every entry to the tar's
//!   numeric uid/gid, which needs privilege or a mapped id range (run it in
//!   a user namespace that maps the image's ids), and a failing `chown` is
//!   then an error.
//! - Device nodes: with [`Devices::Placeholder`] (the default, and what an
//!   unprivileged extraction has to do) a char or block device becomes an
//!   empty regular file with the entry's mode and is listed in
//!   [`LayerReport::devices`]; [`Devices::Create`] makes real nodes (needs
//!   privilege; failures are errors).
//! - Extended attributes (`SCHILY.xattr.*` PAX records) are applied only when
//!   [`ApplyOptions::xattrs`] is set; `trusted.*` never, `security.*` only
//!   when running as root; a file system without xattr support skips them.
//!   Symlinks never get xattrs.
//!
//! # Confinement
//!
//! Every entry's parent directory is resolved through a `cap_std::fs::Dir`
//! opened on the target, which refuses any resolution that leaves it
//! (absolute symlinks, `..` symlinks climbing out); the last component is then
//! handled with `*at` system calls on that directory handle, with a single
//! validated name and without following symlinks. Names are first normalised
//! lexically: an absolute name (except `/` alone, which some writers use for
//! the root, like `./`), a `..` that climbs out, a whiteout of `.` or `..`, a
//! NUL byte, are rejected with [`Error::Rejected`] naming the entry.
//! A symlink inside the tree may be followed as a *parent* (as Docker does);
//! one that points outside makes the entry fail instead of escaping.
//!
//! On an error the target is left partly written (never anything outside
//! it): callers extract into a scratch directory and publish it only on
//! success.
//!
//! # Bounds
//!
//! The tar reader is written here: GNU long names are capped at 64 KiB and
//! PAX headers at 1 MiB before anything is allocated; bodies are streamed
//! through a fixed buffer. GNU sparse files, multi-volume archives and
//! unknown entry types are rejected. Header-only entry types (links,
//! directories, devices, fifos) carry no body whatever their size field says,
//! as Go's `archive/tar` (and so Docker) reads them.

mod apply;
mod compress;
mod digest;
mod oci;
mod tarstream;

use std::io::{self, Read};
use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};

pub use compress::Compression;
pub use digest::{Algorithm, Digest};
pub use oci::{
    unpack_image, BlobDescriptor, Image, ImageConfig, ImportOptions, LayerBlob, Manifest, Platform,
    SourceKind, Unpacked, MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES,
};

/// Who owns the extracted entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Owners {
    /// Leave every entry owned by the extracting user (no `chown` at all).
    #[default]
    Caller,
    /// `chown` every entry (symlinks included) to the tar's numeric uid/gid.
    /// Needs root or a user namespace mapping those ids; errors are errors.
    Keep,
}

/// What to do with character and block device entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Devices {
    /// An empty regular file with the entry's mode (and owner, with
    /// [`Owners::Keep`]), recorded in [`LayerReport::devices`].
    #[default]
    Placeholder,
    /// A real device node (`mknod`); needs privilege.
    Create,
}

/// How layers are applied.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Who owns the extracted entries.
    pub owners: Owners,
    /// How device nodes are handled.
    pub devices: Devices,
    /// Apply `SCHILY.xattr.*` extended attributes (see the module docs).
    pub xattrs: bool,
}

/// Kind of a device node entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A character device.
    Char,
    /// A block device.
    Block,
}

/// A device node found in a layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// Path inside the image, starting with `/` (lossy UTF-8).
    pub path: String,
    /// Character or block device.
    pub kind: DeviceKind,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Owner as recorded in the tar.
    pub uid: u64,
    /// Group as recorded in the tar.
    pub gid: u64,
}

/// What applying one layer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerReport {
    /// Tar entries processed (whiteouts included; extension headers not).
    pub entries: u64,
    /// Device nodes, as placeholders or created (see [`Devices`]).
    pub devices: Vec<DeviceNode>,
}

/// Errors from layers and image sources. Every variant names what it is
/// about: the tar entry, the blob, the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An entry that cannot be applied safely or at all: it would land
    /// outside the target, names nothing, or is of an unsupported kind.
    #[error("layer entry `{entry}` rejected: {reason}")]
    Rejected {
        /// The entry's name as found in the tar.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A file-system operation for an entry failed.
    #[error("layer entry `{entry}`: cannot {op}: {source}")]
    Entry {
        /// The entry's name as found in the tar.
        entry: String,
        /// What was being done.
        op: &'static str,
        /// The system error.
        #[source]
        source: io::Error,
    },
    /// The tar stream is malformed (bad header, truncated, oversized
    /// extension, ...).
    #[error("malformed tar stream at byte {offset}: {reason}")]
    Malformed {
        /// Offset of the header in the uncompressed stream.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// Reading or decompressing failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or written.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A blob's content does not match its digest (or its size).
    #[error("blob {blob}: content does not match: expected {expected}, found {actual}")]
    DigestMismatch {
        /// The blob (digest or path in the source).
        blob: String,
        /// What the manifest or config says.
        expected: String,
        /// What the content gives.
        actual: String,
    },
    /// The image source is not valid or not supported.
    #[error("{what}: {reason}")]
    Image {
        /// The source, file or blob concerned.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// An error while extracting an archive (oci-archive, docker-archive).
    #[error("{archive}: {source}")]
    Archive {
        /// The archive file.
        archive: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// An error while applying one layer of an image.
    #[error("layer {index} of {count} ({name}): {source}")]
    Layer {
        /// 1-based position of the layer.
        index: usize,
        /// Number of layers in the image.
        count: usize,
        /// The layer's digest or path in the source.
        name: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// The tar entry this error is about, if any (looking through
    /// [`Error::Layer`] and [`Error::Archive`]).
    #[must_use]
    pub fn entry(&self) -> Option<&str> {
        match self {
            Error::Rejected { entry, .. } | Error::Entry { entry, .. } => Some(entry),
            Error::Layer { source, .. } | Error::Archive { source, .. } => source.entry(),
            _ => None,
        }
    }
}

/// Result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Applies one layer (a tar stream, plain, gzip or zstd) onto `dest`, a
/// directory handle that confines every write.
///
/// # Errors
///
/// [`Error::Rejected`] for an entry that would escape `dest` or cannot be
/// represented; [`Error::Malformed`] for a broken tar; [`Error::Entry`] for a
/// failing file-system operation; [`Error::Io`] for a failing read. `dest`
/// is then partly written.
pub fn apply_layer<R: Read>(layer: R, dest: &Dir, opts: &ApplyOptions) -> Result<LayerReport> {
    let mut decoder = compress::Decoder::new(layer)?;
    apply::apply_tar(&mut decoder, dest, opts)
}

/// Applies the layer file `layer` onto the directory `dest` (which must
/// exist). See [`apply_layer`].
///
/// # Errors
///
/// As [`apply_layer`], and [`Error::Io`] when either path cannot be opened.
pub fn apply_layer_file(layer: &Path, dest: &Path, opts: &ApplyOptions) -> Result<LayerReport> {
    let file = std::fs::File::open(layer).map_err(|source| Error::Io {
        what: format!("opening layer {}", layer.display()),
        source,
    })?;
    let dir = Dir::open_ambient_dir(dest, ambient_authority()).map_err(|source| Error::Io {
        what: format!("opening target directory {}", dest.display()),
        source,
    })?;
    apply_layer(file, &dir, opts)
}

/// `input` decompressed: plain, gzip or zstd, told from its first bytes.
pub fn decompressed<R: Read>(input: R) -> Result<impl Read> {
    compress::Decoder::new(input)
}
