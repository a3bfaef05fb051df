//! A test's own image store: a temporary `$SIFBOX_CACHE`, with the test's
//! own runtime dir.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{tempdir, Invocation, Sifbox};

/// A test's own store: every command of [`Store::cmd`] runs with
/// `$SIFBOX_CACHE` set to a fresh temporary dir, and with the test's own
/// `$SIFBOX_RUNTIME` ([`Store::sb`]).
#[derive(Debug)]
pub struct Store {
    /// The test's runtime dir (commands without the store go through it).
    pub sb: Sifbox,
    cache: tempfile::TempDir,
}

impl Store {
    /// An empty store in a temporary dir named `prefix...`.
    pub fn new(prefix: &str) -> Store {
        Store {
            sb: Sifbox::new(),
            cache: tempdir(prefix),
        }
    }

    /// The store's dir (`$SIFBOX_CACHE`).
    pub fn path(&self) -> &Path {
        self.cache.path()
    }

    /// `sifbox ARGS...` with this store.
    pub fn cmd<I, S>(&self, args: I) -> Invocation<'_>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.sb.cmd(args).env("SIFBOX_CACHE", self.path())
    }

    /// `sifbox image import SRC --name NAME` with this store.
    pub fn import(&self, src: &Path, name: &str) -> Invocation<'_> {
        self.cmd([
            OsStr::new("image"),
            OsStr::new("import"),
            src.as_os_str(),
            OsStr::new("--name"),
            OsStr::new(name),
        ])
    }

    /// The names in the store's dir `sub` (`images`, `tmp`,
    /// `blobs/sha256`...), sorted; none when it does not exist.
    pub fn entries(&self, sub: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path().join(sub))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The names in the store's tmp/ (work in progress: empty once every
    /// command has ended, or after a `gc`).
    pub fn tmp_entries(&self) -> Vec<String> {
        self.entries("tmp")
    }

    /// Asserts that nothing is left in the store's `tmp/`.
    #[track_caller]
    pub fn assert_tmp_empty(&self) {
        let left = self.tmp_entries();
        assert!(left.is_empty(), "left in the store's tmp/: {left:?}");
    }

    /// Whether the blob `digest` (`sha256:...`) is in the blob cache.
    pub fn has_blob(&self, digest: &str) -> bool {
        self.path()
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
            .is_file()
    }

    /// Where the store unpacks the tree of the image `digest` to run it.
    pub fn tree_of(&self, digest: &str) -> PathBuf {
        self.path().join("rootfs").join(digest.replace(':', "-"))
    }

    /// Whether the store holds files this process may be unable to remove:
    /// an unprivileged caller's builds and unpacks give files to its
    /// subordinate ids.
    fn may_hold_foreign_files(&self) -> bool {
        !super::is_root()
            && super::has_subid_range()
            && ["rootfs", "layers", "build-cache"]
                .iter()
                .any(|d| !self.entries(d).is_empty())
    }

    /// Removes every image and the build cache (whatever the commands'
    /// exit codes). Builds leave trees with files of the caller's subordinate ids, which
    /// only sifbox can remove: then the store's temp dir can go.
    pub fn empty(&self) {
        let quietly = |args: &[&str]| self.cmd(args).timeout(Duration::from_secs(120)).output();
        let ls = quietly(&["image", "ls", "--json"]);
        if let Ok(v) = serde_json::from_str::<Value>(ls.stdout.trim()) {
            for i in v["images"].as_array().into_iter().flatten() {
                if let Some(d) = i["digest"].as_str() {
                    let _ = quietly(&["image", "rm", d]);
                }
            }
        }
        let _ = quietly(&["gc", "--build-cache"]);
    }
}

impl Drop for Store {
    /// An unprivileged test's store keeps files of its subordinate ids,
    /// which the temporary dir's removal cannot delete: sifbox removes
    /// them first (else every run as that user leaked its stores in /tmp).
    fn drop(&mut self) {
        if self.may_hold_foreign_files() {
            self.empty();
            super::make_removable(self.path());
        }
    }
}
