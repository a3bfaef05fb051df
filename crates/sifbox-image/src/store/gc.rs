//! Removing what the store no longer needs: deferred images, abandoned
//! work, unpacked trees without their image, stale sources and locks.

use std::path::PathBuf;

use super::{io, remove_all, Digest, Result, Store};

/// What `gc` removed.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct GcReport {
    pub temp_dirs: Vec<PathBuf>,
    pub unpacked_without_image: Vec<PathBuf>,
    pub stale_sources: Vec<PathBuf>,
    /// Lock files nobody held (left by killed processes).
    pub stale_locks: Vec<PathBuf>,
    /// Images removed with `--force` while in use, now unused and gone.
    pub deferred_images: Vec<String>,
    /// Dirs that could not be removed from the host (files of other ids,
    /// written by build steps under a subordinate id range): for the
    /// caller to remove from inside a user namespace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unremovable: Vec<PathBuf>,
}

impl Store {
    /// Deletes the images removed with `force` while in use that nothing
    /// pins any more; returns their digests. `gc` does it, and `sifbox
    /// stop` after a sandbox of such an image.
    pub fn remove_deferred(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let images_dir = self.root.join("images");
        for e in std::fs::read_dir(&images_dir)
            .map_err(io(&images_dir))?
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(d) = n
                .strip_prefix("sha256-")
                .and_then(|h| h.strip_suffix(".removed"))
                .and_then(|h| Digest::parse_sha256(&format!("sha256:{h}")))
            else {
                continue;
            };
            let _unpack = self.lock(&format!("rootfs-{}", d.hex()))?;
            if let Some(pin) = self.try_lock(&Self::pin_key(&d))? {
                // Made again meanwhile (`publish_sif` takes the mark away
                // under the pin).
                if !self.removed_mark(&d).exists() {
                    continue;
                }
                self.delete_image(&d)?;
                let _ = std::fs::remove_file(self.lock_path(&Self::pin_key(&d)));
                drop(pin);
                out.push(d.to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes leftovers: work dirs nobody holds, unpacked trees whose image
    /// is gone, source records pointing at removed images.
    pub fn gc(&self) -> Result<GcReport> {
        let mut report = GcReport::default();
        let tmp = self.root.join("tmp");
        for e in std::fs::read_dir(&tmp).map_err(io(&tmp))?.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "lock") {
                continue;
            }
            let lock_path = p.with_extension("lock");
            let lock = match sifbox_sys::lockfile::lock(
                &lock_path,
                sifbox_sys::lockfile::Kind::Exclusive,
                false,
                false,
                0,
            ) {
                Ok(Some(l)) => Some(l),
                Ok(None) => continue,
                // No lock file: its maker (who locks first) is gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io(&lock_path)(e)),
            };
            if remove_all(&p).is_ok() {
                // Unlinked while held exclusively (the lock-file protocol).
                if lock.is_some() {
                    let _ = std::fs::remove_file(&lock_path);
                }
                report.temp_dirs.push(p);
            } else {
                report.unremovable.push(p);
            }
        }
        // Lock files of work dirs that are gone.
        for e in std::fs::read_dir(&tmp).map_err(io(&tmp))?.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "lock")
                && !p.with_extension("").exists()
                && sifbox_sys::lockfile::remove_if_unheld(&p).unwrap_or(false)
            {
                report.stale_locks.push(p);
            }
        }
        report.deferred_images = self.remove_deferred()?;
        let images: std::collections::HashSet<Digest> = self.digests()?.into_iter().collect();
        let rootfs = self.root.join("rootfs");
        for e in std::fs::read_dir(&rootfs).map_err(io(&rootfs))?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let d = n
                .strip_prefix("sha256-")
                .and_then(|h| Digest::parse_sha256(&format!("sha256:{h}")));
            // Held while removing: no sandbox of it starts meanwhile, and
            // none that runs (one of an image removed with --force) loses
            // its root.
            let pin = match &d {
                Some(d) if !images.contains(d) => match self.try_lock(&Self::pin_key(d))? {
                    Some(pin) => Some(pin),
                    None => continue,
                },
                _ => None,
            };
            if d.is_none_or(|d| !images.contains(&d)) {
                let _pin = pin;
                let p = e.path();
                if remove_all(&p).is_ok() {
                    report.unpacked_without_image.push(p);
                } else {
                    report.unremovable.push(p);
                }
            }
        }
        // A shared store's private build bases (`layers/image-sha256-HEX`).
        let layers = self.root.join("layers");
        for e in std::fs::read_dir(&layers).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(hex) = n.strip_prefix("image-sha256-") else {
                continue;
            };
            let d = Digest::parse_sha256(&format!("sha256:{hex}"));
            if d.as_ref().is_none_or(|d| !images.contains(d)) {
                let _pin = match &d {
                    Some(d) => match self.try_lock(&Self::pin_key(d))? {
                        Some(pin) => Some(pin),
                        None => continue,
                    },
                    None => None,
                };
                let p = e.path();
                if remove_all(&p).is_ok() {
                    report.unpacked_without_image.push(p);
                } else {
                    report.unremovable.push(p);
                }
            }
        }
        let sources = self.root.join("sources");
        for e in std::fs::read_dir(&sources).map_err(io(&sources))?.flatten() {
            let keep = std::fs::read_to_string(e.path())
                .ok()
                .as_deref()
                .map(str::trim)
                .and_then(Digest::parse_sha256)
                .is_some_and(|d| images.contains(&d));
            if !keep {
                let _ = std::fs::remove_file(e.path());
                report.stale_sources.push(e.path());
            }
        }
        // Lock files nobody holds: every key's work is done or abandoned.
        // Each is unlinked only while held exclusively and still the file
        // at its path, and every locker re-checks that after locking
        // (`sifbox_sys::lockfile`), so no two processes ever hold one
        // lock on two inodes.
        let locks = self.root.join("locks");
        for e in std::fs::read_dir(&locks).map_err(io(&locks))?.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "lock")
                && sifbox_sys::lockfile::remove_if_unheld(&p).unwrap_or(false)
            {
                report.stale_locks.push(p);
            }
        }
        report.stale_locks.sort();
        Ok(report)
    }
}
