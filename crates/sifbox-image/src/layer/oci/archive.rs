//! Extracting an oci-archive or docker-archive into a private scratch
//! directory, told apart from a rootfs tarball by its first entry names.

use std::io;
use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use rustix::fs::{self as rfs, Mode};
use rustix::io::Errno;

use super::model::{is_hex64, SourceKind};
use super::ImportOptions;
use crate::layer::apply::{normalize, remove_tree, Applier};
use crate::layer::compress::Decoder;
use crate::layer::tarstream::TarReader;
use crate::layer::{ApplyOptions, Error, Result};

/// Extracts an oci-archive or docker-archive into a scratch directory.
/// `None` when the file is a rootfs tarball instead: its first entries have
/// names no archive has.
pub(super) fn extract_archive(
    source: &Path,
    opts: &ImportOptions,
) -> Result<Option<(SourceKind, ScratchDir)>> {
    let what = || format!("image source {}", source.display());
    let file = std::fs::File::open(source).map_err(|e| Error::Io {
        what: what(),
        source: e,
    })?;
    let wrap = |e: Error| match e {
        Error::Malformed { offset, reason } => Error::Image {
            what: what(),
            reason: format!(
                "not an image archive or rootfs tarball: malformed tar at byte {offset}: {reason}"
            ),
        },
        other => other,
    };
    let mut dec = Decoder::new(file).map_err(wrap)?;
    let mut tar = TarReader::new(&mut dec);
    let Some(mut entry) = tar.next_entry().map_err(wrap)? else {
        return Ok(None);
    };
    if !archive_name(&entry.path) {
        return Ok(None);
    }
    let base = opts.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = ScratchDir::new(&base).map_err(|e| Error::Io {
        what: format!("creating a scratch directory in {}", base.display()),
        source: e,
    })?;
    let root = scratch.open().map_err(|e| Error::Io {
        what: format!("opening a scratch directory in {}", base.display()),
        source: e,
    })?;
    let in_archive = |e: Error| Error::Archive {
        archive: source.display().to_string(),
        source: Box::new(e),
    };
    let mut applier = Applier::new(&root, &ApplyOptions::default());
    loop {
        if !archive_name(&entry.path) {
            return Ok(None);
        }
        applier.apply(&entry, &mut tar).map_err(in_archive)?;
        match tar.next_entry().map_err(in_archive)? {
            Some(next) => entry = next,
            None => break,
        }
    }
    applier.finish().map_err(in_archive)?;
    let kind = if root.is_file("oci-layout") {
        SourceKind::OciArchive
    } else if root.is_file("manifest.json") {
        SourceKind::DockerArchive
    } else {
        return Ok(None);
    };
    drop(root);
    Ok(Some((kind, scratch)))
}

/// Whether a tar entry's name can be part of an oci-archive or a
/// docker-archive.
fn archive_name(raw: &[u8]) -> bool {
    let Ok(comps) = normalize(raw) else {
        return false;
    };
    let Some(first) = comps.first() else {
        return true;
    };
    matches!(
        *first,
        b"oci-layout" | b"index.json" | b"manifest.json" | b"repositories" | b"blobs"
    ) || is_hex64(first)
        || first.strip_suffix(b".json").is_some_and(is_hex64)
        || first.strip_suffix(b".tar").is_some_and(is_hex64)
}

/// A private directory removed (with all it holds) when dropped.
#[derive(Debug)]
pub(super) struct ScratchDir {
    parent: Dir,
    name: String,
}

impl ScratchDir {
    fn new(base: &Path) -> io::Result<ScratchDir> {
        let parent = Dir::open_ambient_dir(base, ambient_authority())?;
        for _ in 0..16 {
            let mut r = [0u8; 8];
            rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty())?;
            let name = format!(".sifbox-import-{}", hex::encode(r));
            match rfs::mkdirat(&parent, name.as_str(), Mode::RWXU) {
                Ok(()) => return Ok(ScratchDir { parent, name }),
                Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free scratch directory name",
        ))
    }

    pub(super) fn open(&self) -> io::Result<Dir> {
        self.parent.open_dir(&self.name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.parent, self.name.as_bytes()) {
            tracing::warn!(name = %self.name, error = %e, "cannot remove a scratch directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names() {
        let hex = "a".repeat(64);
        for ok in [
            "oci-layout".to_string(),
            "./index.json".into(),
            "blobs/sha256/x".into(),
            format!("{hex}/layer.tar"),
            format!("{hex}.json"),
            format!("{hex}.tar"),
            "./".into(),
        ] {
            assert!(archive_name(ok.as_bytes()), "{ok}");
        }
        for no in ["bin/sh", "./etc/", "../x", "/abs", "manifest.jsonx"] {
            assert!(!archive_name(no.as_bytes()), "{no}");
        }
    }
}
