//! Host trees that a test builds entry by entry (files, dirs, symlinks,
//! modes, mtimes), and the modes of host files.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::tempdir;

/// A host dir tree a test builds: every entry is named relative to the
/// root, its parents are made, and a failure panics naming the path.
#[derive(Debug)]
pub struct Tree {
    root: PathBuf,
    /// The temporary dir of [`Tree::temp`], removed with the tree.
    _temp: Option<tempfile::TempDir>,
}

impl Tree {
    /// A tree at `root` (made, parents too).
    pub fn at(root: impl Into<PathBuf>) -> Tree {
        let root = root.into();
        mkdir(&root);
        Tree { root, _temp: None }
    }

    /// A tree in a fresh temporary dir named `prefix...`, removed when the
    /// tree is dropped.
    pub fn temp(prefix: &str) -> Tree {
        let temp = tempdir(prefix);
        Tree {
            root: temp.path().to_path_buf(),
            _temp: Some(temp),
        }
    }

    /// The root.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `rel` below the root.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        assert!(rel.is_relative(), "{} is not below the tree", rel.display());
        self.root.join(rel)
    }

    /// The dir `rel` (`mkdir -p`).
    pub fn dir(&self, rel: impl AsRef<Path>) -> &Tree {
        mkdir(&self.join(rel));
        self
    }

    /// The file `rel` holding `data`.
    pub fn file(&self, rel: impl AsRef<Path>, data: impl AsRef<[u8]>) -> &Tree {
        let p = self.join(rel);
        if let Some(parent) = p.parent() {
            mkdir(parent);
        }
        std::fs::write(&p, data).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        self
    }

    /// The symlink `rel` to `target`.
    pub fn symlink(&self, rel: impl AsRef<Path>, target: impl AsRef<Path>) -> &Tree {
        let p = self.join(rel);
        if let Some(parent) = p.parent() {
            mkdir(parent);
        }
        std::os::unix::fs::symlink(target.as_ref(), &p)
            .unwrap_or_else(|e| panic!("symlink {}: {e}", p.display()));
        self
    }

    /// Sets the mode of `rel` (`chmod`).
    pub fn mode(&self, rel: impl AsRef<Path>, mode: u32) -> &Tree {
        set_mode(&self.join(rel), mode);
        self
    }

    /// Sets the mtime of `rel`, not following a symlink (`touch -h`).
    pub fn mtime(&self, rel: impl AsRef<Path>, secs: u64) -> &Tree {
        set_mtime(&self.join(rel), secs);
        self
    }
}

fn mkdir(p: &Path) {
    std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir -p {}: {e}", p.display()));
}

/// `chmod MODE P`.
pub fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// The permission bits (with setuid, setgid and sticky) of `p`, not
/// following a symlink.
pub fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// Sets the mtime of `path` (not following a symlink) with `touch -h`.
pub fn set_mtime(path: &Path, secs: u64) {
    let st = Command::new("touch")
        .arg("-h")
        .arg("-d")
        .arg(format!("@{secs}"))
        .arg(path)
        .status()
        .expect("running touch");
    assert!(st.success(), "touch -h {}", path.display());
}
