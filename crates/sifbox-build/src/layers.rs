//! File system states of a build and the cache of their layers.
//!
//! A stage's file system is a base root file system (an unpacked store
//! image, or an empty directory for `scratch`) with layers stacked on it:
//! the overlay upper dirs that earlier steps wrote. A step runs in a sandbox
//! whose overlay has the state's layers below and a fresh upper dir above;
//! when it succeeds, the upper dir is published in the store under the
//! step's cache key (`layers/KEY`), and the next state is the old one plus
//! that layer. Keys chain: a step's key hashes its parent's key and what the
//! step does, so a key names one file system state.
//!
//! `layers/` is 0700 in every store, also a lab group's shared one: the
//! layers keep what steps made setuid (and so do the images built from
//! them), so they are never where another user can run them.
//!
//! Publication is by rename under a per-key lock held across processes, so
//! concurrent builds of one context run each step once and all succeed; a
//! failed or interrupted step leaves only a work dir that `sifbox gc`
//! reclaims.

use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use sha2::{Digest as _, Sha256};
use sifbox_engine::idmap;
use sifbox_engine::spec::{
    Bind, Confinement, IdMapping, NetMode, SandboxSpec, UsernsMode, Writable,
};
use sifbox_engine::{Sandbox, StartOptions};
use sifbox_image::store::Store;

use crate::error::{BuildError, Result};

/// Length of the key prefix that names a layer dir: short names keep the
/// overlay's mount options (one page at most) under the limit for about 90
/// layers.
const LAYER_NAME_LEN: usize = 24;

/// A file system state: a base and the layers on it (bottom first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsState {
    pub base: PathBuf,
    pub layers: Vec<PathBuf>,
    /// The cache key naming this state.
    pub key: String,
}

/// How a step's sandbox is set up.
#[derive(Debug, Clone, Default)]
pub struct StepOptions {
    pub net: NetMode,
    pub binds: Vec<Bind>,
    /// `RUN --mount=type=tmpfs`: file systems of their own.
    pub tmpfs: Vec<sifbox_engine::spec::TmpfsMount>,
}

/// Runs build steps in sandboxes and keeps their layers.
#[derive(Debug)]
pub struct Layers<'s> {
    store: &'s Store,
    dir: PathBuf,
    exe: PathBuf,
    ids: IdMapping,
    /// What build steps may ask of the kernel (the default seccomp policy
    /// unless the build opted out).
    confinement: Confinement,
    /// The most a step's layer may hold, in bytes (see [`Layers::step`]).
    layer_bytes: u64,
}

/// The default bound of a build step's layer: 10 GiB, more than a step
/// that installs a toolchain writes, less than a host's free disk.
pub const DEFAULT_LAYER_BYTES: u64 = 10 << 30;
/// The least a step's layer may be bounded to (ext4's own least).
pub const MIN_LAYER_BYTES: u64 = 16 << 20;

/// Hex SHA-256 of `parts` joined with newlines.
pub fn chain_key(parent: &str, step: &str) -> String {
    let mut h = Sha256::new();
    h.update(parent.as_bytes());
    h.update(b"\n");
    h.update(step.as_bytes());
    hex::encode(h.finalize())
}

impl<'s> Layers<'s> {
    /// Opens the layer cache of `store`; sandboxes are served by the sifbox
    /// binary at `exe`.
    pub fn new(store: &'s Store, exe: PathBuf, userns: UsernsMode) -> Result<Layers<'s>> {
        // Private whatever the store's access (see sifbox_image::store):
        // layers keep the setuid files that steps make, for the images
        // built from them; no other user may reach them.
        let dir = store.root().join("layers");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| BuildError::io(&dir, e))?;
        let ids = idmap::resolve(userns, &idmap::Caller::current())?;
        Ok(Layers {
            store,
            dir,
            exe,
            ids,
            confinement: Confinement::default(),
            layer_bytes: DEFAULT_LAYER_BYTES,
        })
    }

    /// Each step's layer holds at most `bytes` (at least
    /// [`MIN_LAYER_BYTES`]).
    #[must_use]
    pub fn with_layer_size(mut self, bytes: u64) -> Self {
        self.layer_bytes = bytes.max(MIN_LAYER_BYTES);
        self
    }

    /// The bound of a step's layer, in bytes.
    pub fn layer_size(&self) -> u64 {
        self.layer_bytes
    }

    /// Where a step's writes go: a file system of the layer's size, gone
    /// with the sandbox (its upper dir copied out first, see
    /// [`Layers::step`]). As host root an ext4 image on a loop device
    /// (`Writable::Disk`); without root there is no loop device, so a tmpfs
    /// of that size, whose content is memory until the step ends.
    fn bounded_layer(&self) -> Writable {
        let size_mib = self.layer_bytes.div_ceil(1 << 20);
        if sifbox_engine::disk::unavailable().is_none() {
            Writable::Disk {
                size_mib,
                scratch: sifbox_engine::disk::scratch_dir(&self.store.root().join("scratch")),
            }
        } else {
            Writable::Tmpfs { size_mib }
        }
    }

    /// Build steps run under `c` instead of the default confinement.
    #[must_use]
    pub fn with_confinement(mut self, c: Confinement) -> Self {
        self.confinement = c;
        self
    }

    /// The id mapping build sandboxes get.
    pub fn ids(&self) -> &IdMapping {
        &self.ids
    }

    /// The store.
    pub fn store(&self) -> &Store {
        self.store
    }

    /// An empty root file system (for `FROM scratch`).
    pub fn empty_base(&self) -> Result<PathBuf> {
        sifbox_launch::give_back::empty_base(self.store)
            .map_err(|e| BuildError::io(&self.store.root().join("layers/empty"), e))
    }

    fn layer_path(&self, key: &str) -> PathBuf {
        self.dir.join(&key[..LAYER_NAME_LEN.min(key.len())])
    }

    /// The state after a step with cache key `key` if its layer is cached.
    pub fn cached(&self, state: &FsState, key: &str) -> Option<FsState> {
        let p = self.layer_path(key);
        p.is_dir().then(|| state.with_layer(p, key))
    }

    /// Runs a step on `state`: looks up `key`, else runs `f` in a sandbox
    /// writing to a fresh upper dir and publishes it. Returns the new state
    /// and whether it came from the cache. With `no_cache`, the step runs
    /// even when cached, and its layer replaces the cached one.
    pub fn step(
        &self,
        state: &FsState,
        key: &str,
        no_cache: bool,
        opts: &StepOptions,
        f: impl FnOnce(&Sandbox) -> Result<()>,
        stubs: &[String],
    ) -> Result<(FsState, bool)> {
        if !no_cache {
            if let Some(s) = self.cached(state, key) {
                return Ok((s, true));
            }
        }
        let _lock = self.store.lock(&format!("layer-{key}"))?;
        if !no_cache {
            if let Some(s) = self.cached(state, key) {
                return Ok((s, true));
            }
        }
        let work = self.store.work_dir("build-step")?;
        // The step writes on a file system of the layer's size; its upper
        // dir is copied into `work/upper` once its processes are gone.
        let upper = work.path().join("upper");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&upper)
            .map_err(|e| BuildError::io(&upper, e))?;
        let ran = self
            .sandbox_keeping(state, opts, self.bounded_layer(), Some(upper.clone()))
            .and_then(|sb| {
                f(&sb)?;
                sb.stop_keeping_layer(std::time::Duration::ZERO)?;
                Ok(())
            });
        if let Err(e) = ran {
            // What the step wrote may belong to ids the caller cannot
            // remove on the host.
            if let Err(rm) =
                self.remove_trees(&[work.path().join("upper"), work.path().join("work")])
            {
                tracing::warn!("cleaning up after a failed step: {rm}");
            }
            return Err(e);
        }
        let upper = work.path().join("upper");
        remove_stubs(&upper, stubs);
        let dst = self.layer_path(key);
        if dst.exists() {
            // --no-cache: the new layer replaces the old one. Layers are
            // never changed in place: move the old one aside for gc.
            let old = work.path().join("replaced");
            std::fs::rename(&dst, &old).map_err(|e| BuildError::io(&dst, e))?;
        }
        std::fs::rename(&upper, &dst).map_err(|e| BuildError::io(&dst, e))?;
        Ok((state.with_layer(dst, key), false))
    }

    /// Starts a sandbox on `state` whose writes go nowhere (a tmpfs), for
    /// reading a state: `COPY --from`, the final snapshot.
    pub fn reader(&self, state: &FsState) -> Result<Sandbox> {
        self.reader_with(state, Vec::new())
    }

    /// [`Layers::reader`] with host dirs bound in.
    pub fn reader_with(&self, state: &FsState, binds: Vec<Bind>) -> Result<Sandbox> {
        self.sandbox(
            state,
            &StepOptions {
                net: NetMode::None,
                binds,
                tmpfs: Vec::new(),
            },
            Writable::Tmpfs { size_mib: 64 },
        )
    }

    fn sandbox(&self, state: &FsState, opts: &StepOptions, writable: Writable) -> Result<Sandbox> {
        self.sandbox_keeping(state, opts, writable, None)
    }

    fn sandbox_keeping(
        &self,
        state: &FsState,
        opts: &StepOptions,
        writable: Writable,
        keep_layer: Option<PathBuf>,
    ) -> Result<Sandbox> {
        // Unique within the process, also across builds that run side by
        // side (sifbox eval builds its tasks' environments in parallel).
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("build-{}-{n}", std::process::id());
        let mut spec = SandboxSpec::new(name.clone(), state.base.clone(), self.ids.clone());
        spec.layers = state.layers.iter().rev().cloned().collect();
        // BuildKit's host name for build steps.
        spec.hostname = "buildkitsandbox".into();
        spec.net = opts.net;
        spec.writable = writable;
        spec.binds = opts.binds.clone();
        spec.tmpfs = opts.tmpfs.clone();
        spec.keep_layer = keep_layer;
        spec.confinement = self.confinement;
        let mut so = StartOptions::new(self.exe.clone());
        // A build sandbox dies with the build, and is the build's own:
        // not one of the user's in `sifbox ps`.
        so.oneshot = true;
        so.hidden = true;
        let sb = Sandbox::start(spec, &so)?;
        Ok(sb)
    }
}

impl Layers<'_> {
    /// Empties the build cache: every step's layer and every
    /// `RUN --mount=type=cache` directory. Returns what was removed. Do not
    /// run it while builds are running: they would lose their layers.
    pub fn prune(&self) -> Result<Vec<PathBuf>> {
        let mut doomed = Vec::new();
        for dir in [self.dir.clone(), self.store.root().join("build-cache")] {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                if dir == self.dir && e.file_name() == "empty" {
                    continue;
                }
                doomed.push(e.path());
            }
        }
        doomed.sort();
        self.remove_trees(&doomed)?;
        Ok(doomed)
    }

    /// Removes trees that build steps wrote. Files that belong to other ids
    /// of the caller's subordinate range cannot be removed by the caller on
    /// the host; what is left after trying is removed from inside a sandbox
    /// with the same id mapping.
    pub fn remove_trees(&self, paths: &[PathBuf]) -> Result<()> {
        let left: Vec<&PathBuf> = paths
            .iter()
            .filter(|p| match std::fs::remove_dir_all(p) {
                Ok(()) => false,
                Err(e) => e.kind() != std::io::ErrorKind::NotFound,
            })
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        let mut binds = Vec::new();
        let mut targets = Vec::new();
        for (i, p) in left.iter().enumerate() {
            let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
                continue;
            };
            let dst = PathBuf::from(format!("/.sifbox-rm/{i}"));
            targets.push(dst.join(name).display().to_string());
            binds.push(Bind {
                src: parent.to_path_buf(),
                dst,
                readonly: false,
            });
        }
        self.with_helper(binds, |sb| targets.iter().try_for_each(|t| sb.remove(t)))
    }

    /// Runs `f` in a helper sandbox of sifbox's own (the empty base, no
    /// network, `binds` of host dirs) with the mapping of build sandboxes,
    /// then stops it (`sifbox_launch::give_back::Helper`).
    fn with_helper(
        &self,
        binds: Vec<Bind>,
        f: impl FnOnce(&Sandbox) -> sifbox_engine::Result<()>,
    ) -> Result<()> {
        sifbox_launch::give_back::Helper::new(
            self.store,
            self.exe.clone(),
            self.ids.clone(),
            self.confinement,
        )
        .run(binds, f)?;
        Ok(())
    }
}

impl FsState {
    /// This state with one more layer on top.
    pub fn with_layer(&self, layer: PathBuf, key: &str) -> FsState {
        let mut layers = self.layers.clone();
        layers.push(layer);
        FsState {
            base: self.base.clone(),
            layers,
            key: key.to_string(),
        }
    }

    /// Finds `path` (absolute, inside the image) in this state as overlayfs
    /// would, without a sandbox: the topmost layer that has it wins; a
    /// whiteout or an opaque directory above hides what is below. Returns
    /// the host path of what is seen there (symlinks not followed).
    pub fn lookup(&self, path: &str) -> Option<PathBuf> {
        let rel = path.trim_start_matches('/');
        let all: Vec<&Path> = std::iter::once(self.base.as_path())
            .chain(self.layers.iter().map(PathBuf::as_path))
            .collect();
        for (i, dir) in all.iter().enumerate().rev() {
            let candidate = if rel.is_empty() {
                dir.to_path_buf()
            } else {
                dir.join(rel)
            };
            match std::fs::symlink_metadata(&candidate) {
                Ok(m) if is_whiteout(&m) => return None,
                Ok(_) => return Some(candidate),
                Err(_) => {
                    // An opaque parent dir in this layer hides lower ones.
                    if i > 0 && has_opaque_ancestor(dir, rel) {
                        return None;
                    }
                }
            }
        }
        None
    }
}

impl FsState {
    /// Reads the regular file `path` (absolute, inside the image) of this
    /// state, at most `limit` bytes, found as [`FsState::lookup`] finds it
    /// but opened through each layer's directory fd with
    /// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: a symlink a step
    /// planted is never followed on the host. `Ok(None)`: not there. An
    /// error: a symlink (or something not a regular file) is on the way,
    /// which only a sandbox of the state can resolve.
    pub fn read_file(&self, path: &str, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
        use rustix::fs::{FileType, Mode, OFlags};
        use std::io::Read;
        let rel = path.trim_start_matches('/');
        if rel.is_empty() {
            return Err(std::io::Error::other("not a regular file"));
        }
        let all: Vec<&Path> = std::iter::once(self.base.as_path())
            .chain(self.layers.iter().map(PathBuf::as_path))
            .collect();
        let open = |dir: &rustix::fd::OwnedFd, flags: OFlags| {
            sifbox_sys::beneath::open_beneath(dir, rel, flags | OFlags::NOFOLLOW)
        };
        for (i, dir) in all.iter().enumerate().rev() {
            // The layer dir is the store's own path.
            let root = rustix::fs::open(
                *dir,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let at = match open(&root, OFlags::PATH) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => {
                    // An opaque parent dir in this layer hides lower ones.
                    if i > 0 && has_opaque_ancestor(dir, rel) {
                        return Ok(None);
                    }
                    continue;
                }
                // A file or a whiteout above hides what is below.
                Err(rustix::io::Errno::NOTDIR) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let st = rustix::fs::fstat(&at)?;
            match FileType::from_raw_mode(st.st_mode) {
                FileType::CharacterDevice if st.st_rdev == 0 => return Ok(None),
                FileType::RegularFile => {}
                _ => return Err(std::io::Error::other("not a regular file")),
            }
            let f = std::fs::File::from(open(&root, OFlags::RDONLY | OFlags::NONBLOCK)?);
            let now = rustix::fs::fstat(&f)?;
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
                return Err(std::io::Error::other("changed while read"));
            }
            let mut out = Vec::new();
            f.take(limit).read_to_end(&mut out)?;
            return Ok(Some(out));
        }
        Ok(None)
    }
}

fn is_whiteout(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    m.file_type().is_char_device() && m.rdev() == 0
}

fn has_opaque_ancestor(layer: &Path, rel: &str) -> bool {
    let mut p = Path::new(rel);
    while let Some(parent) = p.parent() {
        if parent.as_os_str().is_empty() {
            break;
        }
        let dir = layer.join(parent);
        if let Ok(f) = std::fs::File::open(&dir) {
            let mut buf = [0u8; 4];
            let opaque = rustix::fs::fgetxattr(f.as_fd(), "user.overlay.opaque", &mut buf)
                .ok()
                .is_some_and(|n| buf.get(..n) == Some(b"y".as_slice()));
            if opaque {
                return true;
            }
        }
        p = parent;
    }
    false
}

/// Removes mount points the sandbox made in `upper` (deepest first) when
/// they are still empty directories or empty files. The step could have
/// replaced a directory on the way by a symlink (`/a -> /host/dir`), so
/// each stub's parent is opened beneath `upper` without following any
/// symlink and the stub is removed with `unlinkat` in it: nothing outside
/// the layer is ever removed.
fn remove_stubs(upper: &Path, stubs: &[String]) {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let Ok(root) = rustix::fs::open(
        upper,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    let mut sorted: Vec<&String> = stubs.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.matches('/').count()));
    for s in sorted {
        let rel = s.trim_matches('/');
        let (parent, name) = rel.rsplit_once('/').unwrap_or((".", rel));
        if name.is_empty() || name == "." || name == ".." {
            continue;
        }
        let Ok(dir) = sifbox_sys::beneath::open_beneath(
            &root,
            parent,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        ) else {
            continue;
        };
        match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                // Fails unless it is empty.
                let _ = rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR);
            }
            Ok(st)
                if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                    && st.st_size == 0 =>
            {
                let _ = rustix::fs::unlinkat(&dir, name, AtFlags::empty());
            }
            _ => {}
        }
    }
}
