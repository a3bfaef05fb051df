//! The store's own file operations: atomic replacement, dir modes,
//! removing trees that have read-only dirs.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use super::{io, Result};

/// Replaces `path` with a file holding `data` with mode `mode` (whatever
/// the umask), atomically.
pub(super) fn write_replacing(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(mode))
        .map_err(|e| io(&tmp)(e.into()))?;
    f.write_all(data).map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Gives one of the store's own dirs mode `want` unless it has it (the
/// umask, an older sifbox or the other access left another).
pub(super) fn set_dir_mode(path: &Path, want: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let have = std::fs::metadata(path).map_err(io(path))?.mode() & 0o7777;
    if have != want {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(want)).map_err(io(path))?;
        tracing::debug!(
            "image store: {} was {have:04o}, now {want:04o}",
            path.display()
        );
    }
    Ok(())
}

/// Removes a tree, making read-only dirs writable first.
pub(super) fn remove_all(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            for entry in walk_dirs(path) {
                let _ = std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o700));
            }
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }
}

fn walk_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let _ = std::fs::set_permissions(&out[i], {
            use std::os::unix::fs::PermissionsExt;
            std::fs::Permissions::from_mode(0o700)
        });
        if let Ok(rd) = std::fs::read_dir(&out[i]) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}
