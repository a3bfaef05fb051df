//! Getting images into the store and their root file systems out of it.
//!
//! `import` takes a `.sif` file as it is, or turns a rootfs directory, a
//! rootfs tarball, an OCI layout, an oci-archive or a docker-archive into a
//! SIF (squashfs primary partition, metadata as a JSON object, Apptainer's
//! `/.singularity.d` layout inside); the result is stored under the digest of
//! its bytes. SIFs are written deterministically, so the same input gives the
//! same digest. `rootfs` unpacks an image once (across processes) for the
//! engine, owned by the caller so that every sandbox of the caller maps it.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::layer;
use crate::meta::{self, ImageMeta};
use crate::sif::{self, Arch, DataType, Partition, Sif, SifWriter};
use crate::squash;
use crate::store::{Digest, Reuse, Store, StoreError, WorkDir};

/// Errors of importing and unpacking, each naming the source.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{source_path}: {message}")]
    Source {
        source_path: PathBuf,
        message: String,
    },
    /// A SIF whose own bytes are wrong (a block that does not decompress,
    /// a table that does not fit, a file cut short): refused at import.
    #[error("{}: the SIF itself is damaged: {message}", source_path.display())]
    Damaged {
        source_path: PathBuf,
        message: String,
    },
}

impl ImportError {
    /// What the user can do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            ImportError::Store(e) => e.fix(),
            ImportError::Source { .. } => Some(
                "check the file: a .sif, a rootfs directory or tarball, an OCI layout or archive, or a docker archive".into(),
            ),
            ImportError::Damaged { .. } => Some(
                "nothing was stored; get the file again (download or copy it anew, or build it again) and import that copy".into(),
            ),
        }
    }
}

type Result<T, E = ImportError> = std::result::Result<T, E>;

fn src_err(path: &Path, e: impl std::fmt::Display) -> ImportError {
    ImportError::Source {
        source_path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// What a source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Sif,
    RootfsDir,
    /// A tarball, an OCI layout or archive, or a docker-archive.
    Layers,
}

/// Tells a source's kind from what it is, not its name.
pub fn classify(path: &Path) -> Result<SourceKind> {
    let meta = std::fs::metadata(path).map_err(|e| src_err(path, e))?;
    if meta.is_dir() {
        return Ok(if path.join("oci-layout").is_file() {
            SourceKind::Layers
        } else {
            SourceKind::RootfsDir
        });
    }
    let mut head = [0u8; 48];
    let n = File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| src_err(path, e))?;
    Ok(if n >= 42 && &head[32..42] == b"SIF_MAGIC\0" {
        SourceKind::Sif
    } else {
        SourceKind::Layers
    })
}

/// The result of an import.
#[derive(Debug, Clone)]
pub struct Imported {
    pub digest: Digest,
    /// The reference it was tagged with, if any.
    pub name: Option<String>,
    /// Whether the store already had it (nothing was done).
    pub cached: bool,
}

/// Identifies an unchanged source file: path, inode, size, mtime.
fn file_key(path: &Path) -> Result<String> {
    let canon = std::fs::canonicalize(path).map_err(|e| src_err(path, e))?;
    let m = std::fs::metadata(&canon).map_err(|e| src_err(path, e))?;
    Ok(format!(
        "file:{}:{}:{}:{}:{}",
        canon.display(),
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime_nsec() + m.mtime() * 1_000_000_000
    ))
}

/// Imports `source`, tagging it `name` when given. Concurrent imports of
/// the same source do the work once; all succeed.
pub fn import(store: &Store, source: &Path, name: Option<&str>) -> Result<Imported> {
    let kind = classify(source)?;
    let canon = std::fs::canonicalize(source).map_err(|e| src_err(source, e))?;
    // A directory can change below its top without a trace, so it is never
    // taken from the source cache; its imports are serialized all the same.
    let key = match kind {
        SourceKind::RootfsDir => format!("dir:{}", canon.display()),
        _ => file_key(&canon)?,
    };
    let reuse = if kind == SourceKind::RootfsDir {
        Reuse::Never
    } else {
        Reuse::Yes
    };
    let (digest, cached) = store.make_once(&format!("import:{key}"), reuse, || {
        let work = store.work_dir("import")?;
        Ok::<_, ImportError>(match kind {
            SourceKind::Sif => {
                // Kept byte for byte (its digest is its own), and checked
                // through, the copy rather than the source, which could
                // change in between, before the store shows it.
                let copy = work.path().join("image.sif");
                std::fs::copy(&canon, &copy).map_err(|e| src_err(source, e))?;
                verify_sif(&copy, source)?;
                store.publish_sif(&copy)?
            }
            SourceKind::RootfsDir => {
                let sif = work.path().join("image.sif");
                build_sif(
                    &canon,
                    &ImageMeta::default(),
                    work.path(),
                    &sif,
                    clamp_time(&canon),
                )?;
                store.publish_sif(&sif)?
            }
            SourceKind::Layers => import_layers(
                store,
                &canon,
                &work,
                LayersOptions {
                    clamp: clamp_time(&canon),
                    ..LayersOptions::default()
                },
            )?,
        })
    })?;
    let name = name.map(|n| store.tag(n, &digest)).transpose()?;
    Ok(Imported {
        digest,
        name,
        cached,
    })
}

/// Imports the SIF file open as `file` (`shown` names it in errors): the
/// copy the store keeps is read from this very fd, so what the caller
/// checked when it opened it (eval opens a task's SIF beneath the suite's
/// dir) is what is imported. Reused when the file (device, inode, size,
/// mtime) was imported before.
pub fn import_sif_file(store: &Store, file: &File, shown: &Path) -> Result<Imported> {
    use std::io::{Seek as _, SeekFrom};
    let m = file.metadata().map_err(|e| src_err(shown, e))?;
    if !m.is_file() {
        return Err(src_err(shown, "not a regular file"));
    }
    let mut head = [0u8; 48];
    let n =
        std::os::unix::fs::FileExt::read_at(file, &mut head, 0).map_err(|e| src_err(shown, e))?;
    if n < 42 || &head[32..42] != b"SIF_MAGIC\0" {
        return Err(src_err(shown, "not a SIF file"));
    }
    let key = format!(
        "fd-file:{}:{}:{}:{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime_nsec() + m.mtime() * 1_000_000_000
    );
    let (digest, cached) = store.make_once(&format!("import:{key}"), Reuse::Yes, || {
        let work = store.work_dir("import")?;
        let copy = work.path().join("image.sif");
        let mut src = file.try_clone().map_err(|e| src_err(shown, e))?;
        src.seek(SeekFrom::Start(0))
            .map_err(|e| src_err(shown, e))?;
        let mut out = File::create(&copy).map_err(|e| src_err(&copy, e))?;
        std::io::copy(&mut src, &mut out).map_err(|e| src_err(shown, e))?;
        drop(out);
        verify_sif(&copy, shown)?;
        Ok::<_, ImportError>(store.publish_sif(&copy)?)
    })?;
    Ok(Imported {
        digest,
        name: None,
        cached,
    })
}

/// Checks the SIF at `path` through before it is stored (`source` names it
/// in errors): its header and descriptors, sifbox's metadata object when it
/// has one, and its root file system, a squashfs partition read through
/// (see [`squash::verify_at`]). A damaged file is
/// [`ImportError::Damaged`]; one that is sound but that sifbox cannot run
/// (another file system, xz compression) is [`ImportError::Source`].
pub fn verify_sif(path: &Path, source: &Path) -> Result<()> {
    let damaged = |e: &dyn std::fmt::Display| ImportError::Damaged {
        source_path: source.to_path_buf(),
        message: e.to_string(),
    };
    let sif = Sif::open(path).map_err(|e| match e {
        sif::SifError::Io(_) | sif::SifError::BadVersion { .. } => src_err(source, e),
        other => damaged(&other),
    })?;
    if let Some(d) = sif
        .descriptors()
        .iter()
        .find(|d| d.data_type == DataType::GenericJson && d.name == meta::SIF_OBJECT_NAME)
    {
        let bytes = sif.read_object(d.id, 1 << 20).map_err(|e| damaged(&e))?;
        serde_json::from_slice::<ImageMeta>(&bytes).map_err(|e| {
            damaged(&format!(
                "its metadata object {}: {e}",
                meta::SIF_OBJECT_NAME
            ))
        })?;
    }
    let part = sif.primary_partition().ok_or_else(|| {
        src_err(
            source,
            "the SIF has no primary system partition (no root file system to run)",
        )
    })?;
    if part.partition.as_ref().map(|p| p.fs) != Some(sif::FsType::Squashfs) {
        return Err(src_err(
            source,
            "its root file system is not squashfs, the only kind sifbox runs",
        ));
    }
    let started = std::time::Instant::now();
    let stats = squash::verify_at(sif.file(), part.offset, part.size, 0).map_err(|e| match e {
        squash::SquashError::Io(_) | squash::SquashError::Unsupported { .. } => src_err(source, e),
        other => damaged(&format!("its root file system: {other}")),
    })?;
    tracing::debug!(
        "{}: squashfs checked ({} inodes, {} bytes of data) in {:?}",
        source.display(),
        stats.inodes,
        stats.bytes,
        started.elapsed()
    );
    Ok(())
}

/// How [`import_layers`] checks and packs.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayersOptions {
    /// Entries newer than this get it as their mtime; `None`: the newest
    /// mtime the layers left (so the same layers give the same SIF).
    pub clamp: Option<u32>,
    /// gzip level of the SIF's squashfs; `None`: the default (9, as
    /// mksquashfs). `SIFBOX_GZIP_LEVEL` overrides both.
    pub level: Option<u32>,
    /// The blobs were verified when they were stored (the registry blob
    /// cache): skip the pass that reads them all before anything is
    /// written. They are still checked while they are applied.
    pub blobs_verified: bool,
}

/// Turns a layered source (a rootfs tarball, an OCI layout or archive, a
/// docker-archive) into a stored image, working in `work`: verifies and
/// applies the layers, writes Apptainer's layout from the image config,
/// packs the SIF and keeps the tree as the image's unpacked copy. Imports
/// and registry pulls (which assemble an OCI layout from the blob cache)
/// both come through here.
pub fn import_layers(
    store: &Store,
    source: &Path,
    work: &WorkDir,
    o: LayersOptions,
) -> Result<Digest> {
    let tree = work.path().join("rootfs");
    let opts = layer::ImportOptions {
        tmp_dir: Some(work.path().to_path_buf()),
        ..Default::default()
    };
    let image = layer::Image::open(source, &opts).map_err(|e| src_err(source, e))?;
    if !o.blobs_verified {
        image.verify().map_err(|e| src_err(source, e))?;
    }
    std::fs::create_dir_all(&tree).map_err(|e| src_err(&tree, e))?;
    let dir = cap_std::fs::Dir::open_ambient_dir(&tree, cap_std::ambient_authority())
        .map_err(|e| src_err(&tree, e))?;
    image
        .apply(&dir, &opts.apply)
        .map_err(|e| src_err(source, e))?;
    drop(dir);
    let c = image.config().clone();
    drop(image);
    let m = ImageMeta {
        env: c.env,
        workdir: c.workdir,
        user: c.user,
        entrypoint: c.entrypoint,
        cmd: c.cmd,
        labels: c.labels,
        ..ImageMeta::default()
    };
    // Before the layout files, which are new, are written.
    let clamp = o.clamp.or_else(|| newest_mtime(&tree));
    meta::write_layout(&tree, &m).map_err(|e| src_err(source, e))?;
    if let Some(c) = clamp {
        // The tree sandboxes run is the SIF's twin: the layout just
        // written, and the dirs it added to, have the clamp there too.
        clamp_times(&tree, c).map_err(|e| src_err(&tree, e))?;
    }
    let sif = work.path().join("image.sif");
    build_sif_at_level(&tree, &m, work.path(), &sif, clamp, o.level)?;
    let d = store.publish_sif(&sif)?;
    // The tree is what the SIF holds: keep it as the unpacked copy.
    let _rootfs_lock = store.lock(&format!("rootfs-{}", d.hex()))?;
    store.publish_rootfs(&tree, &d)?;
    Ok(d)
}

/// The newest mtime of any entry in `tree` (not following symlinks).
fn newest_mtime(tree: &Path) -> Option<u32> {
    let mut newest: i64 = 0;
    let mut dirs = vec![tree.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            newest = newest.max(m.mtime());
            if m.is_dir() {
                dirs.push(e.path());
            }
        }
    }
    u32::try_from(newest.max(0)).ok()
}

/// The time every entry newer than the source is clamped to, so that the
/// same source gives the same bytes whenever and wherever it is imported:
/// `SOURCE_DATE_EPOCH` when set, else the source's own mtime.
fn clamp_time(source: &Path) -> Option<u32> {
    let from_env = squash::PackOptions::from_env().clamp_mtime;
    from_env.or_else(|| {
        let m = std::fs::metadata(source).ok()?;
        u32::try_from(m.mtime().max(0)).ok()
    })
}

/// Packs `tree` into a SIF at `out` (deterministic), with `m` as its
/// metadata object; entries newer than `clamp` get `clamp` as mtime.
pub fn build_sif(
    tree: &Path,
    m: &ImageMeta,
    work: &Path,
    out: &Path,
    clamp: Option<u32>,
) -> Result<()> {
    build_sif_at_level(tree, m, work, out, clamp, None)
}

/// [`build_sif`] with a gzip level (1 to 9) other than the default (9, as
/// mksquashfs; `SIFBOX_GZIP_LEVEL` overrides both).
pub fn build_sif_at_level(
    tree: &Path,
    m: &ImageMeta,
    work: &Path,
    out: &Path,
    clamp: Option<u32>,
    level: Option<u32>,
) -> Result<()> {
    let part = work.join("rootfs.sqfs");
    let owner = rustix::process::geteuid().as_raw();
    let opts = squash::PackOptions {
        // Unpacked as an unprivileged caller, the tree's files are the
        // caller's: the image says root, as a root-built one would.
        force_owner: (owner != 0).then_some((0, 0)),
        mkfs_time: clamp,
        clamp_mtime: clamp,
        compression_level: gzip_level(level),
        ..squash::PackOptions::from_env()
    };
    squash::pack(tree, &part, &opts).map_err(|e| src_err(tree, e))?;
    write_sif(&part, m, out)
}

/// The gzip level of a SIF sifbox makes: `SIFBOX_GZIP_LEVEL` (0 to 9) when
/// set, else `level`, else 9 (mksquashfs's).
fn gzip_level(level: Option<u32>) -> u32 {
    let from_env = squash::PackOptions::from_env().compression_level;
    match level {
        Some(l) if std::env::var_os("SIFBOX_GZIP_LEVEL").is_none() => l,
        _ => from_env,
    }
}

/// Writes a deterministic SIF at `out`: `m` as its metadata object, the
/// squashfs image `part` as its primary partition.
fn write_sif(part: &Path, m: &ImageMeta, out: &Path) -> Result<()> {
    let json = serde_json::to_vec(m).map_err(|e| src_err(part, e))?;
    let mut w = SifWriter::deterministic(sif::DETERMINISTIC_TIME);
    w.add_json(meta::SIF_OBJECT_NAME, json)
        .map_err(|e| src_err(part, e))?;
    let part_file = File::open(part).map_err(|e| src_err(part, e))?;
    w.add_partition(part_file, Partition::primary_squashfs(Arch::host()))
        .map_err(|e| src_err(part, e))?;
    let f = File::create(out).map_err(|e| src_err(out, e))?;
    w.write_to(std::io::BufWriter::new(f))
        .map_err(|e| src_err(out, e))?;
    Ok(())
}

/// The edits [`remix_sif`] makes for an image with metadata `m`: `added`
/// (what a build's layers add, see [`squash::Edit::DirAs`] and
/// [`squash::Edit::NewFile`]), then Apptainer's layout for `m` (the list
/// [`meta::write_layout`] writes).
pub fn remix_edits(m: &ImageMeta, added: Vec<squash::Edit>) -> std::io::Result<Vec<squash::Edit>> {
    let mut edits = added;
    edits.extend(meta::layout(m)?.into_iter().map(|entry| match entry {
        meta::LayoutEntry::Dir(d) => squash::Edit::Dir { path: d.into() },
        meta::LayoutEntry::EmptyFileIfMissing(f) => squash::Edit::FileIfMissing { path: f.into() },
        meta::LayoutEntry::File { path, text, mode } => squash::Edit::File {
            path: path.into(),
            data: text.into_bytes(),
            mode: u16::try_from(mode & 0o7777).unwrap_or(0o644),
        },
    }));
    Ok(edits)
}

/// The options [`remix_sif`] remakes with: `time`, root's entries (what
/// the layout makes is root's, as in an image packed from a tree), the
/// gzip `level` as [`build_sif_at_level`]'s.
pub fn remix_options(time: u32, level: Option<u32>) -> squash::RemixOptions {
    squash::RemixOptions {
        time,
        owner: (0, 0),
        compression_level: gzip_level(level),
    }
}

/// Makes a SIF at `out` from the stored image `base` with `m` as its
/// metadata, without unpacking the base or compressing its file data
/// again: the base's squashfs with `edits` ([`remix_edits`]: what a
/// build's layers add, then Apptainer's layout for `m`) written into it
/// ([`squash::remix`] with [`remix_options`]), entries newer than `time`
/// clamped to it, the files the layout writes (and the dirs it adds to)
/// given it. What else the base holds keeps its owners, modes, contents
/// and hard links. Works in `work`.
///
/// `Ok(None)` when the base is one this cannot remake (not gzip, extended
/// attributes, a symlink or a file where the layout writes, an added entry
/// that would replace or change one of the base's): make the tree and
/// pack it instead.
#[allow(clippy::too_many_arguments)]
pub fn remix_sif(
    store: &Store,
    base: &Digest,
    m: &ImageMeta,
    edits: &[squash::Edit],
    work: &Path,
    out: &Path,
    time: u32,
    level: Option<u32>,
) -> Result<Option<squash::RemixStats>> {
    let sif_path = store.sif_path(base);
    let sif = Sif::open(&sif_path).map_err(|e| src_err(&sif_path, e))?;
    let Some(p) = sif.primary_partition() else {
        return Ok(None);
    };
    if p.partition.as_ref().map(|p| p.fs) != Some(sif::FsType::Squashfs) {
        return Ok(None);
    }
    let opts = remix_options(time, level);
    let part = work.join("rootfs.sqfs");
    let stats = match squash::remix(sif.file(), p.offset, p.size, edits, &opts, &part) {
        Ok(s) => s,
        Err(squash::SquashError::Unsupported { what }) => {
            tracing::debug!("{}: not remade in place: {what}", sif_path.display());
            return Ok(None);
        }
        Err(e) => return Err(src_err(&sif_path, e)),
    };
    write_sif(&part, m, out)?;
    std::fs::remove_file(&part).map_err(|e| src_err(&part, e))?;
    Ok(Some(stats))
}

/// The metadata of a stored image (defaults for a foreign SIF without it).
pub fn image_meta(store: &Store, digest: &Digest) -> Result<ImageMeta> {
    Ok(sifbox_meta(store, digest)?.unwrap_or_default())
}

/// The sifbox metadata of a stored image; `None` for a foreign SIF, which
/// has none.
pub fn sifbox_meta(store: &Store, digest: &Digest) -> Result<Option<ImageMeta>> {
    let path = store.sif_path(digest);
    let sif = Sif::open(&path).map_err(|e| src_err(&path, e))?;
    let Some(d) = sif
        .descriptors()
        .iter()
        .find(|d| d.data_type == DataType::GenericJson && d.name == meta::SIF_OBJECT_NAME)
    else {
        return Ok(None);
    };
    let bytes = sif
        .read_object(d.id, 1 << 20)
        .map_err(|e| src_err(&path, e))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| src_err(&path, e))
}

/// The time a stored image records for itself: its squashfs file
/// system's modification time (for images sifbox made, the newest entry
/// time or the clamp it was packed with). A build's default clamp for the
/// files its steps write.
pub fn image_time(store: &Store, digest: &Digest) -> Result<u32> {
    use std::os::unix::fs::FileExt;
    let path = store.sif_path(digest);
    let sif = Sif::open(&path).map_err(|e| src_err(&path, e))?;
    let part = sif
        .primary_partition()
        .ok_or_else(|| src_err(&path, "the SIF has no primary system partition"))?;
    // The superblock: magic, inode count, then the modification time.
    let mut head = [0u8; 12];
    sif.file()
        .read_exact_at(&mut head, part.offset)
        .map_err(|e| src_err(&path, e))?;
    if head[..4] != *b"hsqs" {
        return Err(src_err(&path, "its root file system is not squashfs"));
    }
    Ok(u32::from_le_bytes([head[8], head[9], head[10], head[11]]))
}

/// The unpacked root file system of a stored image, made once (in a
/// shared store without setuid and setgid bits: see [`Store::publish_rootfs`]).
pub fn rootfs(store: &Store, digest: &Digest) -> Result<PathBuf> {
    let sif_path = store.sif_path(digest);
    store.rootfs(digest, |dest| unpack_sif(&sif_path, dest))
}

/// The unpacked root file system of a stored image as a build's base:
/// with its setuid and setgid bits, also in a shared store (see
/// [`Store::build_rootfs`]), so that images built from it keep them.
pub fn build_rootfs(store: &Store, digest: &Digest) -> Result<PathBuf> {
    let sif_path = store.sif_path(digest);
    store.build_rootfs(digest, |dest| unpack_sif(&sif_path, dest))
}

/// The unpacked root file system of a stored image, made once, with the
/// owners its SIF records (which needs root: CAP_CHOWN): what a root
/// build publishes for an image it did not unpack (see [`remix_sif`])
/// whose base's tree has files of other users, as the tree of a root
/// build keeps them.
pub fn rootfs_with_owners(store: &Store, digest: &Digest) -> Result<PathBuf> {
    let sif_path = store.sif_path(digest);
    store.rootfs(digest, |dest| {
        let opts = squash::UnpackOptions {
            owners: squash::Owners::Preserve,
            devices: squash::DeviceNodes::Skip,
            ..squash::UnpackOptions::default()
        };
        unpack_sif_with(&sif_path, dest, &opts)
    })
}

/// Unpacks the root file system of the stored image `digest` into `dest`
/// (new or empty), owned by the caller.
pub fn unpack_image(store: &Store, digest: &Digest, dest: &Path) -> Result<()> {
    unpack_sif(&store.sif_path(digest), dest)
}

/// Unpacks the root file system of the SIF at `sif_path` into `dest`,
/// owned by the caller, without device nodes (no tree of the store holds a
/// live one: see [`squash::DeviceNodes::Skip`]).
fn unpack_sif(sif_path: &Path, dest: &Path) -> Result<()> {
    let opts = squash::UnpackOptions {
        devices: squash::DeviceNodes::Skip,
        ..squash::UnpackOptions::for_caller()
    };
    unpack_sif_with(sif_path, dest, &opts)
}

fn unpack_sif_with(sif_path: &Path, dest: &Path, opts: &squash::UnpackOptions) -> Result<()> {
    let sif = Sif::open(sif_path).map_err(|e| src_err(sif_path, e))?;
    let part = sif
        .primary_partition()
        .ok_or_else(|| src_err(sif_path, "the SIF has no primary system partition"))?;
    if part.partition.as_ref().map(|p| p.fs) != Some(sif::FsType::Squashfs) {
        return Err(src_err(sif_path, "its root file system is not squashfs"));
    }
    squash::unpack_at(sif.file(), part.offset, part.size, dest, opts)
        .map_err(|e| src_err(sif_path, e))?;
    Ok(())
}

/// Writes a stored image as a SIF file (atomically).
pub fn export(store: &Store, digest: &Digest, out: &Path) -> Result<()> {
    let src = store.sif_path(digest);
    let tmp = out.with_extension(format!("sif.tmp{}", std::process::id()));
    std::fs::copy(&src, &tmp).map_err(|e| src_err(out, e))?;
    std::fs::rename(&tmp, out).map_err(|e| src_err(out, e))
}

/// Gives every entry of the tree at `root` newer than `clamp` the time
/// `clamp` (modification and access), symlinks included and never
/// followed: the tree's entries are reached by directory fd and name.
pub fn clamp_times(root: &Path, clamp: u32) -> std::io::Result<()> {
    use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};
    use std::os::fd::OwnedFd;
    let t = Timespec {
        tv_sec: i64::from(clamp),
        tv_nsec: 0,
    };
    let times = Timestamps {
        last_access: t,
        last_modification: t,
    };
    let open_dir = |at: &OwnedFd, name: &std::ffi::CStr| {
        rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let top = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if rustix::fs::fstat(&top)?.st_mtime > i64::from(clamp) {
        rustix::fs::futimens(&top, &times)?;
    }
    let mut stack = vec![top];
    while let Some(dir) = stack.pop() {
        let entries = rustix::fs::Dir::read_from(&dir)?;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
            if st.st_mtime > i64::from(clamp) {
                rustix::fs::utimensat(&dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)?;
            }
            if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory {
                stack.push(open_dir(&dir, name)?);
            }
        }
    }
    Ok(())
}
