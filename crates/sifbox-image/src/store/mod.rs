//! The content-addressed image store.
//!
//! Layout under `$SIFBOX_CACHE` (default `$XDG_CACHE_HOME/sifbox`, else
//! `~/.cache/sifbox`):
//!
//! ```text
//! images/sha256-HEX.sif   images by the digest of their bytes
//! refs/NAME               "name:tag" (escaped) -> digest
//! rootfs/sha256-HEX/      the image's root file system, unpacked once, lazily
//! sources/KEY             import source fingerprint -> digest (dedup of imports)
//! blobs/sha256/HEX        registry blobs (manifests, configs, layers), verified,
//!                         shared by every image pulled from them
//! blobs/partial/sha256-HEX  a download in progress or interrupted: its bytes
//!                         are kept so that the next pull continues it
//! blobs/images/sha256-HEX the blobs an image was made from (for `gc_blobs`)
//! locks/KEY.lock          cross-process locks (flock) on one piece of work
//! tmp/                    work in progress; each dir locked by its maker
//! layers/, build-cache/   the build cache (sifbox-build): steps' layers and
//!                         `RUN --mount=type=cache` dirs
//! ```
//!
//! # Who can reach it
//!
//! An unpacked tree holds the image's setuid files, owned by the caller: as
//! host root, setuid-root binaries that anyone who can reach them runs as
//! root on the host. So a store is private ([`Access::Private`], the
//! default): the root and every dir made in it are 0700 whatever the umask,
//! files 0600, and a store of an older sifbox (0755) is tightened when its
//! owner opens it. A store that belongs to someone else is refused (root
//! writing setuid-root trees into a user's store would hand that user
//! root).
//!
//! [`Access::Group`] is a lab group's shared store: the root, `images/`,
//! `refs/` and `rootfs/` are 02750 (setgid: the root's group carries), the
//! SIFs and references 0644 behind them; everything else (work in
//! progress, locks, sources, blobs, the build cache) stays 0700. Every tree
//! is stripped of its setuid and setgid bits ([`crate::setid`]) before it is
//! renamed into `rootfs/`, and a private store that becomes shared has its
//! trees stripped before `rootfs/` opens up, so no other user can ever run
//! a setuid file from it. The SIFs keep their bits. The group reads; only
//! the owner writes (a member finds an image its owner has not unpacked
//! yet refused with a clear error). Every such tree is also closed to
//! group and world writes ([`crate::setid::close_writes`]: a world-writable
//! `/tmp` there let a member plant a file the owner's sandbox ran), the
//! modes it had recorded in its `.sifbox-modes` for the engine to re-make
//! in each sandbox's own upper layer. A tree is also stripped whenever
//! `rootfs/` is open to others or the store is not the caller's, so that a
//! private-mode process publishing into a store that another process has
//! made shared cannot expose one: publishers hold `locks/store-mode.lock`
//! shared, the switch to shared holds it exclusively.
//!
//! Every result is made under `tmp/`, checked, and renamed into place, so a
//! crash (SIGKILL included) at any moment leaves either no result or a whole
//! one; `gc` removes the leftovers. Work on one key is done once: the first
//! process takes the key's lock, the others wait for it and find the result.
//! flock works across processes and, on NFS and Lustre, across nodes.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

mod blobs;
mod files;
mod gc;
mod names;

pub use blobs::{BlobGcReport, BlobWriter};
use files::{remove_all, set_dir_mode, write_replacing};
pub use gc::GcReport;
pub use names::normalize_name;
use names::{escape, unescape};

/// Errors of the store; each names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("image store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no image {0:?} in the store; `sifbox image ls` lists them")]
    NotFound(String),
    #[error("image reference {reference:?} matches {count} images; give more of the digest")]
    Ambiguous { reference: String, count: usize },
    #[error("{0:?} is not a valid image name: use NAME[:TAG] with letters, digits, '.', '_', '-' and '/'")]
    BadName(String),
    #[error("image store {path} belongs to uid {owner}, not to the caller (uid {me}); a private store is its owner's alone")]
    NotYours { path: PathBuf, owner: u32, me: u32 },
    #[error("image store {path}: {why}")]
    Swappable { path: PathBuf, why: String },
    #[error("the shared image store {path} is only read by its group; its owner (uid {owner}) writes it")]
    ReadOnly { path: PathBuf, owner: u32 },
    #[error("image {digest} is not unpacked in the shared store {path}, which only its owner (uid {owner}) writes: ask them to run it once (`sifbox run {digest} true`)")]
    NotUnpacked {
        digest: String,
        path: PathBuf,
        owner: u32,
    },
    #[error("image {digest} is in use (a sandbox, build or eval job runs it)")]
    InUse { digest: String },
    #[error("blob {expected}: the bytes received ({size} bytes) have digest {actual}; nothing was stored")]
    BlobMismatch {
        expected: String,
        actual: String,
        size: u64,
    },
}

impl StoreError {
    /// What the user can do about it, where the message does not say.
    pub fn fix(&self) -> Option<String> {
        match self {
            StoreError::Io { source, .. } => Some(match source.raw_os_error() {
                Some(28) => "free space on that disk (`sifbox gc` removes what no image needs), or set SIFBOX_CACHE to a store on another one".into(),
                Some(13) => "check the permissions of the image store, or set SIFBOX_CACHE to a directory of your own".into(),
                _ => "check the image store's disk and permissions (SIFBOX_CACHE)".into(),
            }),
            StoreError::NotYours { .. } => Some("use a store of your own (unset SIFBOX_CACHE), or, for a lab group's shared store, set `store.shared = true` in ~/.config/sifbox/config.toml (or SIFBOX_STORE_SHARED=1)".into()),
            StoreError::Swappable { .. } => Some("keep the store under directories only you (or root) can write: set SIFBOX_CACHE to one, e.g. ~/.cache/sifbox".into()),
            StoreError::BlobMismatch { .. } => Some("pull again; if it persists, the registry or a proxy serves other bytes than the manifest names".into()),
            StoreError::NotFound(_)
            | StoreError::Ambiguous { .. }
            | StoreError::BadName(_)
            | StoreError::ReadOnly { .. }
            | StoreError::InUse { .. }
            | StoreError::NotUnpacked { .. } => None,
        }
    }
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The store names images by their SHA-256 digest: sifbox's one digest
/// type.
pub use crate::layer::Digest;

/// File-name form of a digest, `sha256-HEX`.
fn file_stem(d: &Digest) -> String {
    format!("sha256-{}", d.hex())
}

/// Whether [`Store::make_once`] may take what a source made before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Yes, and what is made now is recorded.
    Yes,
    /// Make it anew (`--no-cache`), and record it.
    Refresh,
    /// Make it anew and record nothing: a source whose key cannot tell a
    /// change (a directory), made one at a time all the same.
    Never,
}

/// An exclusive lock on one key, held until dropped.
#[derive(Debug)]
pub struct KeyLock {
    _file: File,
}

/// A hold on a stored image (see [`Store::pin`]): a shared flock on
/// `locks/image-sha256-HEX.lock`, while it (or a clone) lives. A sandbox's
/// supervisor takes its own on the same file ([`ImagePin::path`]) for the
/// sandbox's life.
#[derive(Debug, Clone)]
pub struct ImagePin {
    path: PathBuf,
    _file: std::sync::Arc<File>,
}

impl ImagePin {
    /// The lock file, for another process to hold too.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What [`Store::remove`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// Only the name: the image keeps its other names.
    Name,
    /// The image, with its names and unpacked trees.
    Image,
    /// Its names; the image itself is removed once nothing uses it
    /// (`--force` on an image in use): by `gc`, or the next `remove`.
    Deferred,
}

/// A directory under `tmp/` for work in progress, removed when dropped
/// unless its contents were published; locked while alive so `gc` leaves it.
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    _lock: File,
}

impl WorkDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = remove_all(&self.path);
        let _ = std::fs::remove_file(self.path.with_extension("lock"));
    }
}

/// One image in the store.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageEntry {
    pub digest: String,
    pub refs: Vec<String>,
    pub size: u64,
    pub sif: PathBuf,
    pub unpacked: bool,
    /// When the image was made (Unix seconds): its SIF's own time (see
    /// [`crate::sif::Sif::image_time`]), else when it was stored.
    pub created: u64,
}

/// Who may read a store (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Only its owner.
    #[default]
    Private,
    /// The owner writes, the store root's group reads and runs images.
    Group,
}

/// The store.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    access: Access,
    /// The store root's owner (the caller, unless a shared store).
    owner: u32,
}

const SUBDIRS: [&str; 12] = [
    "images",
    "refs",
    "rootfs",
    "sources",
    "locks",
    "tmp",
    "blobs",
    "blobs/sha256",
    "blobs/partial",
    "blobs/images",
    "layers",
    "build-cache",
];

/// What a shared store's group reads: running an image needs its name, its
/// SIF and its tree. `rootfs` last: it opens up only once its trees are
/// stripped.
const GROUP_READS: [&str; 3] = ["images", "refs", "rootfs"];

const PRIVATE_DIR: u32 = 0o700;
const SHARED_DIR: u32 = 0o2750;

/// The lock publishers of trees hold shared and the switch to a shared
/// store holds exclusively.
const MODE_LOCK: &str = "store-mode";

impl Store {
    /// The default location: `$SIFBOX_CACHE`, else `$XDG_CACHE_HOME/sifbox`,
    /// else `~/.cache/sifbox`.
    pub fn default_root() -> PathBuf {
        if let Some(p) = std::env::var_os("SIFBOX_CACHE").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
            return PathBuf::from(p).join("sifbox");
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        home.join(".cache").join("sifbox")
    }

    /// Opens (creating) the private store at its default location.
    pub fn open_default() -> Result<Store> {
        Store::open(&Store::default_root())
    }

    /// Opens (creating) the private store at `root`.
    pub fn open(root: &Path) -> Result<Store> {
        Store::open_with(root, Access::Private)
    }

    /// Opens (creating) the store at `root` with `access`: its owner gets
    /// the modes of that access set on the store's own dirs (a private
    /// store made shared has its trees stripped first). A private store
    /// must be the caller's; a shared one may be another user's, which is
    /// then only read.
    pub fn open_with(root: &Path, access: Access) -> Result<Store> {
        use std::os::unix::fs::MetadataExt;
        let me = rustix::process::geteuid().as_raw();
        // Everything in the store is reached by paths below `root`: a
        // directory above it that another user could change would let
        // them swap the store (its trees, which sandboxes run) for theirs.
        sifbox_sys::check_ancestors(root).map_err(|e| StoreError::Swappable {
            path: root.to_path_buf(),
            why: e.to_string(),
        })?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR)
            .create(root)
            .map_err(io(root))?;
        let meta = std::fs::metadata(root).map_err(io(root))?;
        if meta.uid() != me && access == Access::Private {
            return Err(StoreError::NotYours {
                path: root.to_path_buf(),
                owner: meta.uid(),
                me,
            });
        }
        let store = Store {
            root: root.to_path_buf(),
            access,
            owner: meta.uid(),
        };
        let mine = store.owner == me;
        if mine && access == Access::Private {
            // First: it closes every path into the store at once.
            set_dir_mode(root, PRIVATE_DIR)?;
        }
        for d in SUBDIRS {
            let p = root.join(d);
            match std::fs::DirBuilder::new().mode(PRIVATE_DIR).create(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                // A member of a shared store's group cannot write it.
                Err(_) if !mine => continue,
                Err(e) => return Err(io(&p)(e)),
            }
            if mine && (access == Access::Private || !GROUP_READS.contains(&d)) {
                set_dir_mode(&p, PRIVATE_DIR)?;
            }
        }
        if mine && access == Access::Group {
            store.open_to_group()?;
        }
        Ok(store)
    }

    /// Gives the root and [`GROUP_READS`] the shared mode and the root's
    /// group. A store whose `rootfs/` the group could not read yet is
    /// closed first, has its trees stripped and its SIFs and references
    /// made readable, and opens only then. All under [`MODE_LOCK`]: a
    /// private-mode process may close `rootfs/` at any moment (which is
    /// always safe) and then publish a tree with its bits; `rootfs/` is
    /// opened only by a holder who has just seen it shared or stripped it.
    fn open_to_group(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let rootfs = self.root.join("rootfs");
        let _switch = self.lock(MODE_LOCK)?;
        // 0750 only ever comes from here (setgid may not stick: a chmod by
        // an owner outside the dir's group drops it). An older sifbox's
        // 0755 or a private 0700 means trees that may have their bits.
        let was = std::fs::metadata(&rootfs).map_err(io(&rootfs))?.mode();
        if was & 0o777 != SHARED_DIR & 0o777 {
            set_dir_mode(&self.root, PRIVATE_DIR)?;
            set_dir_mode(&rootfs, PRIVATE_DIR)?;
            for e in std::fs::read_dir(&rootfs).map_err(io(&rootfs))?.flatten() {
                let tree = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let n = crate::setid::strip_tree(&tree).map_err(io(&tree))?;
                    tracing::debug!(
                        "image store: {n} setuid/setgid files stripped in {} before the store is shared",
                        tree.display()
                    );
                    crate::setid::close_writes(&tree).map_err(io(&tree))?;
                }
            }
            for d in ["images", "refs"] {
                let dir = self.root.join(d);
                for e in std::fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_file()) {
                        let p = e.path();
                        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))
                            .map_err(io(&p))?;
                    }
                }
            }
        }
        // Trees a shared store published before trees were closed to the
        // group's writes (no record yet): closed now, once.
        for e in std::fs::read_dir(&rootfs).map_err(io(&rootfs))?.flatten() {
            let tree = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir())
                && std::fs::symlink_metadata(tree.join(crate::setid::MODES_RECORD)).is_err()
            {
                crate::setid::close_writes(&tree).map_err(io(&tree))?;
            }
        }
        let group = std::fs::metadata(&self.root).map_err(io(&self.root))?.gid();
        set_dir_mode(&self.root, SHARED_DIR)?;
        for d in GROUP_READS {
            let p = self.root.join(d);
            if std::fs::metadata(&p).map_err(io(&p))?.gid() != group {
                // Made before the store was shared, in a dir without setgid.
                std::os::unix::fs::chown(&p, None, Some(group)).map_err(io(&p))?;
            }
            set_dir_mode(&p, SHARED_DIR)?;
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Who may read this store.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The mode of a file in a dir the group of a shared store reads (a
    /// SIF, a reference): others are kept out by the dirs above.
    fn shared_file_mode(&self) -> u32 {
        match self.access {
            Access::Private => 0o600,
            Access::Group => 0o644,
        }
    }

    /// Whether a tree must lose its setuid and setgid bits before it is
    /// published: in a shared store, and whenever `rootfs/` is open to
    /// anyone but its owner or the store is not the caller's (another
    /// process made it shared, or root writes into a user's store). Hold
    /// [`MODE_LOCK`] shared while deciding and publishing.
    fn publishes_stripped(&self) -> Result<bool> {
        use std::os::unix::fs::MetadataExt;
        if self.access == Access::Group || self.owner != rustix::process::geteuid().as_raw() {
            return Ok(true);
        }
        let rootfs = self.root.join("rootfs");
        let m = std::fs::metadata(&rootfs).map_err(io(&rootfs))?;
        Ok(m.mode() & 0o077 != 0 || m.uid() != self.owner)
    }

    /// Path of the lock file of `key`.
    fn lock_path(&self, key: &str) -> PathBuf {
        self.root
            .join("locks")
            .join(format!("{}.lock", escape(key)))
    }

    /// Takes `key`'s lock (made when missing) as `kind` says, waiting for
    /// other holders when `wait`; `None`: not waiting, and held. Through
    /// `sifbox_sys::lockfile`, so that `gc` may remove lock files nobody
    /// holds.
    fn lock_key(
        &self,
        key: &str,
        kind: sifbox_sys::lockfile::Kind,
        wait: bool,
    ) -> Result<Option<KeyLock>> {
        let path = self.lock_path(key);
        match sifbox_sys::lockfile::lock(&path, kind, wait, true, 0o600) {
            Ok(f) => Ok(f.map(|f| KeyLock { _file: f })),
            // A member of a shared store's group cannot write it.
            Err(e)
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    && self.access == Access::Group =>
            {
                Err(StoreError::ReadOnly {
                    path: self.root.clone(),
                    owner: self.owner,
                })
            }
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Takes `key`'s lock shared with other holders of it shared.
    fn lock_shared(&self, key: &str) -> Result<KeyLock> {
        self.lock_key(key, sifbox_sys::lockfile::Kind::Shared, true)?
            .ok_or_else(|| io(&self.lock_path(key))(std::io::Error::other("not locked")))
    }

    /// Takes the exclusive lock on `key`, waiting for another holder.
    pub fn lock(&self, key: &str) -> Result<KeyLock> {
        self.lock_key(key, sifbox_sys::lockfile::Kind::Exclusive, true)?
            .ok_or_else(|| io(&self.lock_path(key))(std::io::Error::other("not locked")))
    }

    /// The pin key of image `d`.
    fn pin_key(d: &Digest) -> String {
        format!("image-{}", file_stem(d))
    }

    /// Pins image `d`: while the pin (or a process holding its
    /// [`ImagePin::path`] the same way) lives, [`Store::remove`] refuses to
    /// delete the image (or, forced, only removes its names) and `gc`
    /// keeps its trees. Waits while a removal of it is under way, and then
    /// finds it gone (`NotFound`). `None` where the caller cannot write
    /// the store (a member of a shared store's group): such users are not
    /// seen by the owner's removals.
    pub fn pin(&self, d: &Digest) -> Result<Option<ImagePin>> {
        let key = Self::pin_key(d);
        let held = match self.lock_key(&key, sifbox_sys::lockfile::Kind::Shared, true) {
            Ok(Some(l)) => l,
            Ok(None) => {
                return Err(io(&self.lock_path(&key))(std::io::Error::other(
                    "not locked",
                )))
            }
            Err(StoreError::ReadOnly { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !self.sif_path(d).exists() || self.removed_mark(d).exists() {
            return Err(StoreError::NotFound(d.to_string()));
        }
        Ok(Some(ImagePin {
            path: self.lock_path(&key),
            _file: std::sync::Arc::new(held._file),
        }))
    }

    /// Whether some process pins image `d` (see [`Store::pin`]).
    pub fn is_pinned(&self, d: &Digest) -> bool {
        sifbox_sys::lockfile::is_held(&self.lock_path(&Self::pin_key(d))).unwrap_or(true)
    }

    /// The mark of an image removed while in use (`--force`): it has no
    /// names, is not listed or resolved, and goes once unpinned.
    fn removed_mark(&self, d: &Digest) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.removed", file_stem(d)))
    }

    /// A fresh work dir under `tmp/`.
    pub fn work_dir(&self, purpose: &str) -> Result<WorkDir> {
        let mut rnd = [0u8; 8];
        let _ = rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty());
        let name = format!(
            "{}-{}-{}",
            escape(purpose),
            std::process::id(),
            hex::encode(rnd)
        );
        let path = self.root.join("tmp").join(&name);
        let lock_path = path.with_extension("lock");
        // With the re-check after locking: `gc` removes lock files without
        // a dir that nobody holds, which this one is until it is locked.
        let lock = sifbox_sys::lockfile::lock(
            &lock_path,
            sifbox_sys::lockfile::Kind::Exclusive,
            true,
            true,
            0o600,
        )
        .map_err(io(&lock_path))?
        .ok_or_else(|| io(&lock_path)(std::io::Error::other("not locked")))?;
        std::fs::DirBuilder::new()
            .mode(PRIVATE_DIR)
            .create(&path)
            .map_err(io(&path))?;
        Ok(WorkDir { path, _lock: lock })
    }

    /// Path of an image's SIF.
    pub fn sif_path(&self, d: &Digest) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.sif", file_stem(d)))
    }

    /// Path of an image's unpacked root file system.
    pub fn rootfs_path(&self, d: &Digest) -> PathBuf {
        self.root.join("rootfs").join(file_stem(d))
    }

    /// Publishes a finished SIF (a file in a work dir) under its digest;
    /// returns the digest. Publishing the same content twice keeps one copy.
    pub fn publish_sif(&self, file: &Path) -> Result<Digest> {
        let digest = Digest::sha256_of_file(file).map_err(io(file))?;
        let dst = self.sif_path(&digest);
        // Made again after a forced removal that still waits for its users:
        // it stays. Under its pin, so that `gc` is not deleting it now.
        let _revived = if self.removed_mark(&digest).exists() {
            let pin = self.lock_key(
                &Self::pin_key(&digest),
                sifbox_sys::lockfile::Kind::Shared,
                true,
            )?;
            let _ = std::fs::remove_file(self.removed_mark(&digest));
            pin
        } else {
            None
        };
        if dst.exists() {
            let _ = std::fs::remove_file(file);
        } else {
            File::open(file)
                .and_then(|f| {
                    rustix::fs::fchmod(
                        &f,
                        rustix::fs::Mode::from_raw_mode(self.shared_file_mode()),
                    )?;
                    f.sync_all()
                })
                .map_err(io(file))?;
            std::fs::rename(file, &dst).map_err(io(&dst))?;
        }
        Ok(digest)
    }

    /// Publishes an unpacked tree for `digest` (if none is there yet); in a
    /// shared store (see [`Store::publishes_stripped`]) the tree loses its
    /// setuid and setgid bits first.
    pub fn publish_rootfs(&self, tree: &Path, digest: &Digest) -> Result<PathBuf> {
        let dst = self.rootfs_path(digest);
        if dst.exists() {
            return Ok(dst);
        }
        let _mode = self.lock_shared(MODE_LOCK)?;
        if self.publishes_stripped()? {
            let n = crate::setid::strip_tree(tree).map_err(io(tree))?;
            tracing::debug!("image store: {n} setuid/setgid files stripped in {digest}");
            // Nothing in it writable by the group or others (a /tmp where a
            // member plants what the owner's sandbox runs); the modes are
            // re-made in each sandbox's own upper layer.
            crate::setid::close_writes(tree).map_err(io(tree))?;
        }
        match std::fs::rename(tree, &dst) {
            Ok(()) => {}
            // Someone else published it first: keep theirs.
            Err(_) if dst.exists() => {}
            Err(e) => return Err(io(&dst)(e)),
        }
        Ok(dst)
    }

    /// Path of the tree a build starts from when it is `FROM` image `d`
    /// (see [`Store::build_rootfs`]).
    pub fn build_rootfs_path(&self, d: &Digest) -> PathBuf {
        match self.access {
            Access::Private => self.rootfs_path(d),
            Access::Group => self
                .root
                .join("layers")
                .join(format!("image-{}", file_stem(d))),
        }
    }

    /// The unpacked tree of `digest` with its setuid and setgid bits, for
    /// builds: what is built from an image keeps them. In a private store
    /// that is [`Store::rootfs`]; a shared store's trees are stripped, so it
    /// keeps a private copy under `layers/` (0700, never the group's).
    pub fn build_rootfs<E>(
        &self,
        digest: &Digest,
        unpack: impl FnOnce(&Path) -> std::result::Result<(), E>,
    ) -> std::result::Result<PathBuf, E>
    where
        E: From<StoreError>,
    {
        if self.access == Access::Private {
            return self.rootfs(digest, unpack);
        }
        let dst = self.build_rootfs_path(digest);
        if dst.is_dir() {
            return Ok(dst);
        }
        let _lock = self.lock(&format!("build-rootfs-{}", digest.hex()))?;
        if dst.is_dir() {
            return Ok(dst);
        }
        let work = self.work_dir("unpack")?;
        let tree = work.path().join("rootfs");
        unpack(&tree)?;
        std::fs::rename(&tree, &dst).map_err(io(&dst))?;
        Ok(dst)
    }

    /// Returns the unpacked root file system of `digest`, making it with
    /// `unpack(dest)` once (across processes) if it is not there.
    pub fn rootfs<E>(
        &self,
        digest: &Digest,
        unpack: impl FnOnce(&Path) -> std::result::Result<(), E>,
    ) -> std::result::Result<PathBuf, E>
    where
        E: From<StoreError>,
    {
        let dst = self.rootfs_path(digest);
        if dst.is_dir() {
            return Ok(dst);
        }
        let _lock = self
            .lock(&format!("rootfs-{}", digest.hex()))
            .map_err(|e| match e {
                StoreError::ReadOnly { path, owner } => StoreError::NotUnpacked {
                    digest: digest.to_string(),
                    path,
                    owner,
                },
                e => e,
            })?;
        if dst.is_dir() {
            return Ok(dst);
        }
        let work = self.work_dir("unpack")?;
        let tree = work.path().join("rootfs");
        unpack(&tree)?;
        Ok(self.publish_rootfs(&tree, digest)?)
    }

    /// Takes the lock on `key` if nobody holds it.
    fn try_lock(&self, key: &str) -> Result<Option<KeyLock>> {
        self.lock_key(key, sifbox_sys::lockfile::Kind::Exclusive, false)
    }

    /// Points `name` (NAME[:TAG], tag default `latest`) at `digest`.
    pub fn tag(&self, name: &str, digest: &Digest) -> Result<String> {
        let name = normalize_name(name)?;
        let path = self.root.join("refs").join(escape(&name));
        write_replacing(&path, digest.as_str().as_bytes(), self.shared_file_mode())?;
        Ok(name)
    }

    /// Every reference name with its digest.
    pub fn refs(&self) -> Result<Vec<(String, Digest)>> {
        let dir = self.root.join("refs");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
            let name = unescape(&e.file_name().to_string_lossy());
            if name.contains(".tmp") {
                continue;
            }
            if let Some(d) = std::fs::read_to_string(e.path())
                .ok()
                .as_deref()
                .and_then(Digest::parse_sha256)
            {
                out.push((name, d));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every image (by digest) in the store.
    pub fn digests(&self) -> Result<Vec<Digest>> {
        let dir = self.root.join("images");
        let mut out: Vec<Digest> = std::fs::read_dir(&dir)
            .map_err(io(&dir))?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                let hex = n.strip_prefix("sha256-")?.strip_suffix(".sif")?;
                Digest::parse_sha256(&format!("sha256:{hex}"))
            })
            .filter(|d| !self.removed_mark(d).exists())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Resolves NAME[:TAG], a digest, or a unique digest prefix (at least 6
    /// hex digits, with or without `sha256:`).
    pub fn resolve(&self, reference: &str) -> Result<Digest> {
        if let Some(d) = Digest::parse_sha256(reference) {
            return if self.sif_path(&d).exists() && !self.removed_mark(&d).exists() {
                Ok(d)
            } else {
                Err(StoreError::NotFound(reference.to_string()))
            };
        }
        if let Ok(name) = normalize_name(reference) {
            if let Some((_, d)) = self.refs()?.into_iter().find(|(n, _)| *n == name) {
                return Ok(d);
            }
        }
        let prefix = reference.trim_start_matches("sha256:");
        if prefix.len() >= 6 && prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hits: Vec<Digest> = self
                .digests()?
                .into_iter()
                .filter(|d| d.hex().starts_with(&prefix.to_ascii_lowercase()))
                .collect();
            return match hits.len() {
                1 => Ok(hits
                    .into_iter()
                    .next()
                    .ok_or_else(|| StoreError::NotFound(reference.into()))?),
                0 => Err(StoreError::NotFound(reference.to_string())),
                n => Err(StoreError::Ambiguous {
                    reference: reference.to_string(),
                    count: n,
                }),
            };
        }
        Err(StoreError::NotFound(reference.to_string()))
    }

    /// The store's images with their references.
    pub fn list(&self) -> Result<Vec<ImageEntry>> {
        let refs = self.refs()?;
        let mut out = Vec::new();
        for d in self.digests()? {
            let sif = self.sif_path(&d);
            let meta = std::fs::metadata(&sif).map_err(io(&sif))?;
            out.push(ImageEntry {
                refs: refs
                    .iter()
                    .filter(|(_, rd)| *rd == d)
                    .map(|(n, _)| n.clone())
                    .collect(),
                size: meta.len(),
                // The image's own time (the same for a digest in every
                // store), else when it was stored.
                created: crate::sif::Sif::open(&sif)
                    .ok()
                    .and_then(|s| s.image_time())
                    .and_then(|t| u64::try_from(t).ok())
                    .or_else(|| {
                        meta.modified()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map(|d| d.as_secs())
                    })
                    .unwrap_or_default(),
                unpacked: self.rootfs_path(&d).is_dir(),
                digest: d.to_string(),
                sif,
            });
        }
        Ok(out)
    }

    /// Removes a reference; when no reference is left to the image (or
    /// `reference` was a digest or a digest prefix), removes the image and
    /// its unpacked tree. An image that some process pins
    /// ([`Store::pin`]: a sandbox runs it, a build or eval uses it) is not
    /// removed: [`StoreError::InUse`], or with `force` its names are
    /// removed now and the image once nothing pins it ([`Removed::Deferred`];
    /// `gc` does it). Returns the digest and what was removed.
    pub fn remove(&self, reference: &str, force: bool) -> Result<(Digest, Removed)> {
        let d = self.resolve(reference)?;
        let refs = self.refs()?;
        let name = normalize_name(reference)
            .ok()
            .filter(|n| refs.iter().any(|(rn, rd)| rn == n && *rd == d));
        let names: Vec<&String> = refs
            .iter()
            .filter(|(_, rd)| *rd == d)
            .map(|(n, _)| n)
            .collect();
        let unref = |n: &str| {
            let _ = std::fs::remove_file(self.root.join("refs").join(escape(n)));
        };
        if let Some(n) = &name {
            if names.len() > 1 {
                unref(n);
                return Ok((d, Removed::Name));
            }
        }
        // The image goes: not while it is being unpacked, nor while used.
        let _unpack = self.lock(&format!("rootfs-{}", d.hex()))?;
        let Some(pin) = self.try_lock(&Self::pin_key(&d))? else {
            if !force {
                return Err(StoreError::InUse {
                    digest: d.to_string(),
                });
            }
            let mark = self.removed_mark(&d);
            write_replacing(&mark, b"", 0o600)?;
            for n in names {
                unref(n);
            }
            return Ok((d, Removed::Deferred));
        };
        for n in names {
            unref(n);
        }
        self.delete_image(&d)?;
        // Unlinked while held exclusively (the lock-file protocol).
        let _ = std::fs::remove_file(self.lock_path(&Self::pin_key(&d)));
        drop(pin);
        Ok((d, Removed::Image))
    }

    /// Deletes image `d`'s SIF, mark and unpacked tree. Hold its pin
    /// exclusively.
    fn delete_image(&self, d: &Digest) -> Result<()> {
        let sif = self.sif_path(d);
        match std::fs::remove_file(&sif) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&sif)(e)),
        }
        let _ = std::fs::remove_file(self.removed_mark(d));
        // Move the tree aside first so no reader sees half of it.
        let tree = self.rootfs_path(d);
        if tree.exists() {
            let work = self.work_dir("remove")?;
            let aside = work.path().join("rootfs");
            std::fs::rename(&tree, &aside).map_err(io(&tree))?;
        }
        Ok(())
    }

    /// The one "make once per key" protocol of the store, for imports, pulls
    /// and builds: under the lock of `key` (concurrent makers of one source
    /// wait, and then find the first one's image), the image this source
    /// made before, if it is still stored and `reuse` allows; else `make`'s,
    /// recorded for next time (unless `reuse` is [`Reuse::Never`]). Returns
    /// the digest and whether it was made before.
    pub fn make_once<E: From<StoreError>>(
        &self,
        key: &str,
        reuse: Reuse,
        make: impl FnOnce() -> std::result::Result<Digest, E>,
    ) -> std::result::Result<(Digest, bool), E> {
        if reuse == Reuse::Yes {
            // Most calls end here, without a lock file.
            if let Some(d) = self.recall_source(key) {
                return Ok((d, true));
            }
        }
        let _lock = self.lock(&format!("make-{key}"))?;
        if reuse == Reuse::Yes {
            if let Some(d) = self.recall_source(key) {
                return Ok((d, true));
            }
        }
        let d = make()?;
        if reuse != Reuse::Never {
            self.remember_source(key, &d)?;
        }
        Ok((d, false))
    }

    /// Records that an import source with `key` produced `digest`.
    pub fn remember_source(&self, key: &str, digest: &Digest) -> Result<()> {
        let path = self.root.join("sources").join(escape(key));
        write_replacing(&path, digest.as_str().as_bytes(), 0o600)
    }

    /// The digest an import source with `key` produced, if still stored.
    pub fn recall_source(&self, key: &str) -> Option<Digest> {
        let path = self.root.join("sources").join(escape(key));
        let d = Digest::parse_sha256(std::fs::read_to_string(path).ok()?.trim())?;
        (self.sif_path(&d).exists() && !self.removed_mark(&d).exists()).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let t = tempfile::tempdir().expect("tempdir");
        let s = Store::open(t.path()).expect("open");
        (t, s)
    }

    fn make_sif(s: &Store, content: &[u8]) -> Digest {
        let w = s.work_dir("test").expect("work");
        let f = w.path().join("x.sif");
        std::fs::write(&f, content).expect("write");
        s.publish_sif(&f).expect("publish")
    }

    #[test]
    fn names_normalize() {
        assert_eq!(normalize_name("debian").expect("ok"), "debian:latest");
        assert_eq!(normalize_name("a/b:1.0").expect("ok"), "a/b:1.0");
        assert_eq!(
            normalize_name("host:5000/x").expect("ok"),
            "host:5000/x:latest"
        );
        for bad in ["", ":x", "a:", "../x", "a b", "sha256:abc", "-x"] {
            assert!(normalize_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_source_is_made_once_and_reused_as_asked() {
        let (_t, s) = store();
        let made = std::sync::atomic::AtomicUsize::new(0);
        let make = |content: &'static [u8]| {
            made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, StoreError>(make_sif(&s, content))
        };
        // Four makers at once: one makes, the others find its image.
        let results: Vec<(Digest, bool)> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| sc.spawn(|| s.make_once("k", Reuse::Yes, || make(b"one")).expect("make")))
                .collect();
            hs.into_iter().map(|h| h.join().expect("join")).collect()
        });
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(results.iter().filter(|(_, cached)| !cached).count(), 1);
        assert!(results.iter().all(|(d, _)| *d == results[0].0));
        // Refresh makes it anew and records that; Never records nothing.
        let (d2, cached) = s
            .make_once("k", Reuse::Refresh, || make(b"two"))
            .expect("make");
        assert!(!cached);
        assert_eq!(s.recall_source("k"), Some(d2.clone()));
        let (d3, _) = s
            .make_once("dir", Reuse::Never, || make(b"three"))
            .expect("make");
        assert_eq!(s.recall_source("dir"), None);
        assert_ne!(d3, d2);
        // A failed make records nothing.
        let e = s.make_once("bad", Reuse::Yes, || {
            Err::<Digest, _>(StoreError::NotFound("x".into()))
        });
        assert!(e.is_err());
        assert_eq!(s.recall_source("bad"), None);
    }

    #[test]
    fn publish_tag_resolve_remove() {
        let (_t, s) = store();
        let d = make_sif(&s, b"one");
        assert_eq!(make_sif(&s, b"one"), d, "same content, same digest");
        s.tag("demo/x:1", &d).expect("tag");
        s.tag("other", &d).expect("tag");
        assert_eq!(s.resolve("demo/x:1").expect("name"), d);
        assert_eq!(s.resolve(d.as_str()).expect("digest"), d);
        assert_eq!(s.resolve(&d.hex()[..8]).expect("prefix"), d);
        assert!(matches!(s.resolve("nope"), Err(StoreError::NotFound(_))));
        let l = s.list().expect("list");
        assert_eq!(l.len(), 1);
        assert_eq!(
            l[0].refs,
            vec!["demo/x:1".to_string(), "other:latest".to_string()]
        );
        // Removing one name keeps the image for the other.
        s.remove("demo/x:1", false).expect("rm");
        assert!(s.sif_path(&d).exists());
        s.remove("other", false).expect("rm");
        assert!(!s.sif_path(&d).exists());
        assert!(s.list().expect("list").is_empty());
    }

    #[test]
    fn rootfs_is_made_once_across_threads() {
        let (_t, s) = store();
        let d = make_sif(&s, b"tree");
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (s, d, made) = (s.clone(), d.clone(), made.clone());
                std::thread::spawn(move || {
                    s.rootfs(&d, |dest| -> Result<()> {
                        made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        std::fs::create_dir_all(dest.join("etc")).map_err(io(dest))?;
                        Ok(())
                    })
                    .expect("rootfs")
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().expect("join").join("etc").is_dir());
        }
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn blobs_resume_verify_and_gc() {
        let (_t, s) = store();
        let data = b"layer bytes, twice as long as half".repeat(100);
        let d = Digest::sha256_of(&data);
        {
            let _l = s.lock_blob(&d).expect("lock");
            let mut w = s.blob_writer(&d, Some(data.len() as u64)).expect("writer");
            assert_eq!(w.offset(), 0);
            w.write(&data[..1000]).expect("write");
            // Interrupted: dropped without finishing.
        }
        assert!(!s.has_blob(&d));
        let mut w = s.blob_writer(&d, Some(data.len() as u64)).expect("writer");
        assert_eq!(w.offset(), 1000, "continues where it stopped");
        w.write(&data[1000..]).expect("write");
        let p = w.finish().expect("matches");
        assert_eq!(std::fs::read(&p).expect("read"), data);
        assert!(s.has_blob(&d));

        // Wrong bytes: an error, nothing stored, no partial left.
        let other = Digest::sha256_of(b"expected");
        let mut w = s.blob_writer(&other, None).expect("writer");
        w.write(b"something else").expect("write");
        let e = w.finish().expect_err("mismatch");
        assert!(matches!(e, StoreError::BlobMismatch { .. }), "{e}");
        assert!(!s.has_blob(&other));
        assert_eq!(
            std::fs::read_dir(s.root().join("blobs/partial"))
                .expect("dir")
                .count(),
            0
        );

        // A partial longer than the blob is started over.
        let mut w = s.blob_writer(&other, None).expect("writer");
        w.write(b"0123456789").expect("write");
        drop(w);
        assert_eq!(s.blob_writer(&other, Some(4)).expect("w").offset(), 0);
        // An interrupted download keeps its bytes (an empty one leaves nothing).
        let mut w = s.blob_writer(&other, None).expect("writer");
        w.write(b"ab").expect("write");
        drop(w);
        assert!(s
            .root()
            .join("blobs/partial")
            .join(file_stem(&other))
            .exists());

        // gc_blobs keeps what a stored image was made from.
        let image = make_sif(&s, b"image");
        s.record_image_blobs(&image, std::slice::from_ref(&d))
            .expect("record");
        let unused = Digest::sha256_of(b"unused");
        let mut w = s.blob_writer(&unused, None).expect("writer");
        w.write(b"unused").expect("write");
        w.finish().expect("finish");
        let r = s.gc_blobs().expect("gc");
        assert!(s.has_blob(&d) && !s.has_blob(&unused), "{r:?}");
        // The unused blob and the abandoned partial download of `other`.
        assert_eq!(r.removed.len(), 2, "{r:?}");
        // Once the image is gone, its blobs go too.
        s.remove(image.as_str(), false).expect("rm");
        s.gc_blobs().expect("gc");
        assert!(!s.has_blob(&d));
    }

    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
    }

    fn chmod(p: &Path, m: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    }

    /// A place for a store not made yet (`store` in a temporary dir).
    fn store_root() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().expect("tempdir");
        let root = t.path().join("store");
        (t, root)
    }

    /// A private store at `root` with an image unpacked to a tree that
    /// has its setuid bits (see [`setid_tree`]).
    fn store_with_setid_tree(root: &Path) -> (Store, Digest, PathBuf) {
        let s = Store::open(root).expect("open");
        let d = make_sif(&s, b"old");
        let tree = s.rootfs(&d, setid_tree).expect("rootfs");
        (s, d, tree)
    }

    /// The store at `root` and its rootfs/ 0755, as an older sifbox left
    /// them.
    fn loosen_as_an_older_sifbox_left_it(root: &Path) {
        chmod(root, 0o755);
        chmod(&root.join("rootfs"), 0o755);
    }

    /// Opens the store at `root` private and asserts it closed the store
    /// and its rootfs/ to the group.
    fn assert_reopens_private(root: &Path) {
        Store::open(root).expect("reopen private");
        assert_eq!(mode_of(root), 0o700);
        assert_eq!(mode_of(&root.join("rootfs")), 0o700);
    }

    /// A tree as an unpack leaves it: a setuid and a setgid file.
    fn setid_tree(dest: &Path) -> Result<()> {
        std::fs::create_dir_all(dest.join("bin")).map_err(io(dest))?;
        for (name, m) in [("su", 0o4755), ("wall", 0o2755)] {
            let p = dest.join("bin").join(name);
            std::fs::write(&p, b"decoy").map_err(io(&p))?;
            chmod(&p, m);
        }
        Ok(())
    }

    #[test]
    fn a_private_store_is_0700_and_an_old_one_is_tightened() {
        let (_t, root) = store_root();
        let s = Store::open(&root).expect("open");
        assert_eq!(mode_of(&root), 0o700);
        for d in SUBDIRS {
            assert_eq!(mode_of(&root.join(d)), 0o700, "{d}");
        }
        let d = make_sif(&s, b"private");
        assert_eq!(mode_of(&s.sif_path(&d)), 0o600);
        s.tag("p:1", &d).expect("tag");
        assert_eq!(mode_of(&root.join("refs/p:1")), 0o600);
        let w = s.work_dir("x").expect("work");
        assert_eq!(mode_of(w.path()), 0o700);
        drop(w);
        // A private store keeps the bits (sudo works in its sandboxes).
        let tree = s.rootfs(&d, setid_tree).expect("rootfs");
        assert_eq!(mode_of(&tree.join("bin/su")), 0o4755);
        loosen_as_an_older_sifbox_left_it(&root);
        assert_reopens_private(&root);
    }

    #[test]
    fn a_shared_store_opens_to_its_group_only_stripped_trees() {
        let (_t, root) = store_root();
        // Private first, with a tree that has its bits.
        let (private, _old, old_tree) = store_with_setid_tree(&root);
        assert_eq!(mode_of(&old_tree.join("bin/su")), 0o4755);

        let s = Store::open_with(&root, Access::Group).expect("open shared");
        assert_eq!(mode_of(&root), SHARED_DIR);
        for d in SUBDIRS {
            let want = if GROUP_READS.contains(&d) {
                SHARED_DIR
            } else {
                PRIVATE_DIR
            };
            assert_eq!(mode_of(&root.join(d)), want, "{d}");
        }
        // Trees made before the switch lost their bits before it opened.
        assert_eq!(mode_of(&old_tree.join("bin/su")), 0o755);
        assert_eq!(mode_of(&old_tree.join("bin/wall")), 0o755);
        // New trees lose them when published; the SIF keeps its bytes.
        let d = make_sif(&s, b"new");
        assert_eq!(mode_of(&s.sif_path(&d)), 0o644);
        let tree = s.rootfs(&d, setid_tree).expect("rootfs");
        assert_eq!(mode_of(&tree.join("bin/su")), 0o755);
        assert_eq!(mode_of(&tree.join("bin/wall")), 0o755);
        // A build's base keeps them, out of the group's reach.
        let base = s.build_rootfs(&d, setid_tree).expect("base");
        assert!(base.starts_with(root.join("layers")), "{}", base.display());
        assert_eq!(mode_of(&base.join("bin/su")), 0o4755);
        // A process that still opened the store private publishes into
        // the shared store stripped all the same.
        let late = make_sif(&s, b"late");
        let work = private.work_dir("late").expect("work");
        setid_tree(&work.path().join("t")).expect("tree");
        let published = private
            .publish_rootfs(&work.path().join("t"), &late)
            .expect("publish");
        assert_eq!(mode_of(&published.join("bin/su")), 0o755);
        // gc removes a build base whose image is gone.
        s.remove(d.as_str(), false).expect("rm");
        let r = s.gc().expect("gc");
        assert!(r.unpacked_without_image.contains(&base), "{r:?}");
        // Opened private again: closed to the group at once.
        assert_reopens_private(&root);
    }

    #[test]
    fn an_older_open_store_made_shared_is_stripped_first() {
        let (_t, root) = store_root();
        let (_s, _d, tree) = store_with_setid_tree(&root);
        // As an older sifbox left it: 0755, whose group bits are those of
        // a shared rootfs/ but whose trees were never stripped.
        loosen_as_an_older_sifbox_left_it(&root);
        Store::open_with(&root, Access::Group).expect("open shared");
        assert_eq!(mode_of(&tree.join("bin/su")), 0o755);
        assert_eq!(mode_of(&root.join("rootfs")), SHARED_DIR);
    }

    #[test]
    fn a_pinned_image_is_not_removed_and_force_defers_it() {
        let (_t, s) = store();
        let d = make_sif(&s, b"pinned");
        s.tag("p:1", &d).expect("tag");
        let tree = s
            .rootfs(&d, |dest| {
                std::fs::create_dir_all(dest.join("etc")).map_err(io(dest))
            })
            .expect("rootfs");
        let pin = s.pin(&d).expect("pin").expect("a pin");
        assert!(s.is_pinned(&d));
        assert!(matches!(
            s.remove("p:1", false),
            Err(StoreError::InUse { .. })
        ));
        assert!(matches!(
            s.remove(d.as_str(), false),
            Err(StoreError::InUse { .. })
        ));
        assert_eq!(s.resolve("p:1").expect("still named"), d);
        // gc leaves a pinned image's tree alone.
        s.gc().expect("gc");
        assert!(tree.is_dir());
        // Forced: the name goes now, the image stays for its user.
        assert_eq!(s.remove("p:1", true).expect("rm -f").1, Removed::Deferred);
        assert!(s.list().expect("ls").is_empty());
        assert!(s.resolve(d.as_str()).is_err() && s.resolve("p:1").is_err());
        assert!(s.pin(&d).is_err(), "no new user of a removed image");
        let r = s.gc().expect("gc");
        assert!(r.deferred_images.is_empty() && tree.is_dir(), "{r:?}");
        drop(pin);
        let r = s.gc().expect("gc");
        assert_eq!(r.deferred_images, vec![d.to_string()]);
        assert!(!tree.exists() && !s.sif_path(&d).exists());
        // Unpinned, a removal is immediate.
        let d2 = make_sif(&s, b"free");
        s.tag("f:1", &d2).expect("tag");
        drop(s.pin(&d2).expect("pin"));
        assert_eq!(s.remove("f:1", false).expect("rm").1, Removed::Image);
        assert!(!s.sif_path(&d2).exists());
    }

    #[test]
    fn an_image_made_again_after_a_forced_removal_stays() {
        let (_t, s) = store();
        let d = make_sif(&s, b"again");
        let pin = s.pin(&d).expect("pin");
        s.remove(d.as_str(), true).expect("rm -f");
        assert_eq!(make_sif(&s, b"again"), d);
        drop(pin);
        assert!(s.gc().expect("gc").deferred_images.is_empty());
        assert_eq!(s.resolve(d.as_str()).expect("kept"), d);
    }

    /// Lockers of one key and `gc` removing lock files at the same time:
    /// never two holders at once.
    #[test]
    fn gc_removing_lock_files_never_lets_two_hold_a_key() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let (_t, s) = store();
        let inside = AtomicUsize::new(0);
        let worst = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let removed = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            let gc = sc.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let r = s.gc().expect("gc");
                    removed.fetch_add(r.stale_locks.len(), Ordering::SeqCst);
                }
            });
            let lockers: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        for _ in 0..200 {
                            let l = s.lock("k").expect("lock");
                            let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            worst.fetch_max(n, Ordering::SeqCst);
                            std::thread::yield_now();
                            inside.fetch_sub(1, Ordering::SeqCst);
                            drop(l);
                        }
                    })
                })
                .collect();
            for l in lockers {
                l.join().expect("join");
            }
            stop.store(true, Ordering::SeqCst);
            gc.join().expect("gc");
        });
        assert_eq!(worst.load(Ordering::SeqCst), 1, "two held the key at once");
        assert!(
            removed.load(Ordering::SeqCst) > 0,
            "gc never removed the lock file"
        );
        s.gc().expect("gc");
        assert!(std::fs::read_dir(s.root().join("locks"))
            .expect("locks")
            .next()
            .is_none());
    }

    #[test]
    fn gc_removes_abandoned_work_only() {
        let (_t, s) = store();
        let live = s.work_dir("live").expect("work");
        std::fs::write(live.path().join("f"), b"x").expect("write");
        // An abandoned dir: no lock holder (as after a SIGKILL).
        let dead = s.root().join("tmp").join("dead-1-00");
        std::fs::create_dir_all(dead.join("sub")).expect("mkdir");
        std::fs::write(dead.with_extension("lock"), b"").expect("lock");
        // An unpacked tree whose image is gone.
        let orphan = s.rootfs_path(&Digest::sha256_of(b"gone"));
        std::fs::create_dir_all(&orphan).expect("mkdir");
        let r = s.gc().expect("gc");
        assert_eq!(r.temp_dirs, vec![dead.clone()]);
        assert_eq!(r.unpacked_without_image, vec![orphan.clone()]);
        assert!(!dead.exists() && !orphan.exists());
        assert!(live.path().join("f").exists());
    }
}
