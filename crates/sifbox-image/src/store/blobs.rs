//! The blob cache of registry pulls: blobs written (resumably, hashed as
//! they come), recorded per image, and collected when no image needs them.

use std::fs::File;
use std::io::{Read as _, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;

use sha2::{Digest as _, Sha256};

use super::{file_stem, io, write_replacing, Digest, KeyLock, Result, Store, StoreError};

/// A blob being written into the store's blob cache: bytes go to its
/// partial file (kept when the writer is dropped, so that a later download
/// continues it), are hashed as they come, and [`BlobWriter::finish`] moves
/// the file into place only when the digest matches. Hold
/// [`Store::lock_blob`] while writing.
pub struct BlobWriter {
    digest: Digest,
    partial: PathBuf,
    dst: PathBuf,
    file: File,
    hasher: Sha256,
    len: u64,
}

impl std::fmt::Debug for BlobWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobWriter")
            .field("digest", &self.digest)
            .field("partial", &self.partial)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl BlobWriter {
    /// Bytes already written (kept from an earlier, interrupted download
    /// included): where the download continues.
    pub fn offset(&self) -> u64 {
        self.len
    }

    /// The blob this writer makes.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// Appends `data`.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.file.write_all(data).map_err(io(&self.partial))?;
        self.hasher.update(data);
        self.len += data.len() as u64;
        Ok(())
    }

    /// Forgets what was written (the server sent the whole blob again).
    pub fn restart(&mut self) -> Result<()> {
        self.file.set_len(0).map_err(io(&self.partial))?;
        std::io::Seek::seek(&mut self.file, std::io::SeekFrom::Start(0))
            .map_err(io(&self.partial))?;
        self.hasher = Sha256::new();
        self.len = 0;
        Ok(())
    }

    /// Checks the digest and publishes the blob; on a mismatch the partial
    /// file is removed and nothing is stored.
    pub fn finish(mut self) -> Result<PathBuf> {
        let hasher = std::mem::take(&mut self.hasher);
        let actual = Digest::parse_sha256(&format!("sha256:{}", hex::encode(hasher.finalize())))
            .ok_or_else(|| StoreError::Io {
                path: self.partial.clone(),
                source: std::io::Error::other("a SHA-256 digest that is not one"),
            })?;
        let partial = std::mem::take(&mut self.partial);
        if actual != self.digest {
            let _ = std::fs::remove_file(&partial);
            return Err(StoreError::BlobMismatch {
                expected: self.digest.to_string(),
                actual: actual.to_string(),
                size: self.len,
            });
        }
        self.file.sync_all().map_err(io(&partial))?;
        std::fs::rename(&partial, &self.dst).map_err(io(&self.dst))?;
        Ok(std::mem::take(&mut self.dst))
    }

    /// Removes the partial file (its bytes cannot be continued).
    pub fn discard(mut self) {
        let _ = std::fs::remove_file(std::mem::take(&mut self.partial));
    }
}

impl Drop for BlobWriter {
    /// An interrupted download keeps its bytes for the next one; an empty
    /// partial file is not worth keeping.
    fn drop(&mut self) {
        if self.len == 0 && !self.partial.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// What [`Store::gc_blobs`] removed.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct BlobGcReport {
    /// Blobs no stored image was made from, and abandoned partial downloads.
    pub removed: Vec<PathBuf>,
    /// Their size in bytes.
    pub bytes: u64,
}

impl Store {
    /// Path of a cached registry blob (`blobs/sha256/HEX`).
    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs").join("sha256").join(d.hex())
    }

    /// Whether the blob cache holds `d` (verified when it was stored).
    pub fn has_blob(&self, d: &Digest) -> bool {
        self.blob_path(d).is_file()
    }

    /// The lock serializing the download of one blob across processes.
    pub fn lock_blob(&self, d: &Digest) -> Result<KeyLock> {
        self.lock(&format!("blob-{}", d.hex()))
    }

    /// A writer for blob `d` that continues its partial file, if any (the
    /// bytes there are hashed first). A partial file longer than
    /// `expected_size` is started over. Hold [`Store::lock_blob`].
    pub fn blob_writer(&self, d: &Digest, expected_size: Option<u64>) -> Result<BlobWriter> {
        let partial = self.root.join("blobs").join("partial").join(file_stem(d));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&partial)
            .map_err(io(&partial))?;
        let mut hasher = Sha256::new();
        let have = file.metadata().map_err(io(&partial))?.len();
        let len = if expected_size.is_some_and(|s| have > s) {
            file.set_len(0).map_err(io(&partial))?;
            0
        } else {
            std::io::copy(&mut (&file).take(have), &mut hasher).map_err(io(&partial))?
        };
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(len)).map_err(io(&partial))?;
        file.set_len(len).map_err(io(&partial))?;
        Ok(BlobWriter {
            dst: self.blob_path(d),
            digest: d.clone(),
            partial,
            file,
            hasher,
            len,
        })
    }

    /// Records that image `image` was made from `blobs`, so that
    /// [`Store::gc_blobs`] keeps them while the image is stored.
    pub fn record_image_blobs(&self, image: &Digest, blobs: &[Digest]) -> Result<()> {
        let path = self
            .root
            .join("blobs")
            .join("images")
            .join(file_stem(image));
        let text: String = blobs.iter().map(|b| format!("{b}\n")).collect();
        write_replacing(&path, text.as_bytes(), 0o600)
    }

    /// Removes cached blobs that no stored image was made from, and partial
    /// downloads nobody is continuing right now. (`gc` leaves the blob
    /// cache alone: it is what makes the next pull of a related image fast,
    /// and what an interrupted pull continues from.)
    pub fn gc_blobs(&self) -> Result<BlobGcReport> {
        let mut report = BlobGcReport::default();
        let images: std::collections::HashSet<Digest> = self.digests()?.into_iter().collect();
        let records = self.root.join("blobs").join("images");
        let mut keep = std::collections::HashSet::new();
        for e in std::fs::read_dir(&records).map_err(io(&records))?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let image = n
                .strip_prefix("sha256-")
                .and_then(|h| Digest::parse_sha256(&format!("sha256:{h}")));
            match image {
                Some(d) if images.contains(&d) => {
                    let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                    keep.extend(text.lines().filter_map(Digest::parse_sha256));
                }
                _ => {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let remove = |p: PathBuf, report: &mut BlobGcReport| {
            let size = std::fs::symlink_metadata(&p).map(|m| m.len()).unwrap_or(0);
            if std::fs::remove_file(&p).is_ok() {
                report.bytes += size;
                report.removed.push(p);
            }
        };
        let blobs = self.root.join("blobs").join("sha256");
        for e in std::fs::read_dir(&blobs).map_err(io(&blobs))?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(d) = Digest::parse_sha256(&format!("sha256:{n}")) else {
                continue;
            };
            if keep.contains(&d) {
                continue;
            }
            // Not while a pull is using it.
            let Ok(lock) = self.try_lock(&format!("blob-{}", d.hex())) else {
                continue;
            };
            if let Some(_held) = lock {
                remove(e.path(), &mut report);
            }
        }
        let partial = self.root.join("blobs").join("partial");
        for e in std::fs::read_dir(&partial).map_err(io(&partial))?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(hex) = n.strip_prefix("sha256-") else {
                continue;
            };
            if let Ok(Some(_held)) = self.try_lock(&format!("blob-{hex}")) {
                remove(e.path(), &mut report);
            }
        }
        report.removed.sort();
        Ok(report)
    }
}
