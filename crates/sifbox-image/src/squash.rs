//! Squashfs (version 4.0, gzip) images: [`pack`] a directory tree into one,
//! [`unpack`] one into a directory, [`verify_at`] one without unpacking it,
//! [`remix`] one into a new one with a few files changed, reusing its data.
//!
//! The format is implemented here rather than through a squashfs crate so
//! that sifbox controls what matters to it: hard links stay links, output
//! is byte-for-byte deterministic, data blocks are compressed on all CPUs,
//! and reading an untrusted image never panics, never allocates from an
//! unchecked size and never writes outside the destination.
//!
//! What an image keeps: regular files (all-zero blocks stored as holes),
//! directories (also empty ones), symlinks, hard links (one inode, several
//! names), block and character devices, fifos and sockets; for each the
//! permission bits including setuid, setgid and sticky, the owner uid and
//! gid, and the modification time in whole seconds (0 to 2^32-1; times
//! outside are clamped). Not kept: extended attributes (so file
//! capabilities and ACLs are lost), access times, sub-second times.
//!
//! Images made by `mksquashfs -comp gzip` (or zstd) read back; xz, lzo,
//! lz4 and lzma images are refused with [`SquashError::Unsupported`].

mod codec;
mod format;
mod pack;
mod remix;
mod unpack;
mod verify;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Errors of packing and unpacking. Each names what failed and where.
#[derive(Debug, thiserror::Error)]
pub enum SquashError {
    /// A system call on a path failed.
    #[error(transparent)]
    Io(#[from] crate::IoAt),
    /// The tree to pack holds something squashfs cannot record, changed
    /// while being read, or an option is out of range.
    #[error("cannot pack {}: {what}", path.display())]
    Input { path: PathBuf, what: String },
    /// The bytes do not start with a squashfs superblock.
    #[error("not a squashfs image (bad magic)")]
    NotSquashfs,
    /// The image is a squashfs that sifbox does not read.
    #[error("unsupported squashfs image: {what}")]
    Unsupported { what: String },
    /// The image is damaged or crafted: an offset, size or count is wrong.
    #[error("corrupt squashfs image: {what}")]
    Corrupt { what: String },
    /// An entry's name would leave the destination or is not a plain name.
    #[error("refusing squashfs entry {path:?}: {why}")]
    UnsafeEntry { path: String, why: &'static str },
    /// [`unpack`] extracts into a new or empty directory only.
    #[error("destination {} is not empty", path.display())]
    DestNotEmpty { path: PathBuf },
}

/// How [`pack`] records the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackOptions {
    /// The image's own time stamp; `None` takes the newest mtime in the tree,
    /// so that packing the same tree twice gives the same bytes.
    pub mkfs_time: Option<u32>,
    /// Entries modified after this time are recorded with this time
    /// (the `SOURCE_DATE_EPOCH` rule of reproducible builds).
    pub clamp_mtime: Option<u32>,
    /// Record every entry as owned by this (uid, gid) instead of its own,
    /// e.g. `Some((0, 0))` for a rootfs unpacked by an unprivileged user.
    pub force_owner: Option<(u32, u32)>,
    /// gzip level, 1 to 9 (mksquashfs uses 9), or 0 to store every block
    /// uncompressed (still a valid gzip image).
    pub compression_level: u32,
    /// Data block size: a power of two from 4 KiB to 1 MiB (default 128 KiB,
    /// as mksquashfs).
    pub block_size: u32,
    /// Compressing threads; 0 means one per CPU.
    pub threads: usize,
}

impl Default for PackOptions {
    fn default() -> Self {
        Self {
            mkfs_time: None,
            clamp_mtime: None,
            force_owner: None,
            compression_level: 9,
            block_size: 128 * 1024,
            threads: 0,
        }
    }
}

impl PackOptions {
    /// The defaults, with `SOURCE_DATE_EPOCH` (when set to a number) as the
    /// image time and as the clamp for entry times, and `SIFBOX_GZIP_LEVEL`
    /// (0 to 9) as the gzip level.
    pub fn from_env() -> Self {
        let epoch = std::env::var("SOURCE_DATE_EPOCH")
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .map(|v| u32::try_from(v.max(0)).unwrap_or(u32::MAX));
        let level = std::env::var("SIFBOX_GZIP_LEVEL")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|l| *l <= 9);
        Self {
            mkfs_time: epoch,
            clamp_mtime: epoch,
            compression_level: level.unwrap_or(Self::default().compression_level),
            ..Self::default()
        }
    }
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackStats {
    /// Inodes in the image (hard links count once).
    pub inodes: u32,
    /// Bytes of regular file data read.
    pub data_bytes: u64,
    /// Size of the image file, padded to 4 KiB.
    pub image_bytes: u64,
    /// Fragment blocks (where small files are packed together).
    pub fragments: u32,
}

/// Who owns what [`unpack`] creates.
///
/// Only a privileged process can give files to other users, so an
/// unprivileged caller must use [`Owners::Caller`] (everything then belongs
/// to the caller, which is also what the store wants: ids every sandbox
/// maps). The image's owners are still recorded in the image itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Owners {
    /// Give each entry the uid and gid recorded in the image (needs
    /// CAP_CHOWN; fails with EPERM otherwise).
    #[default]
    Preserve,
    /// Leave everything owned by the calling process. Modes are still
    /// applied in full, setuid and setgid bits included (on files that the
    /// caller then owns).
    Caller,
    /// Give everything this uid and gid.
    Fixed { uid: u32, gid: u32 },
}

/// What [`unpack`] does with block and character devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceNodes {
    /// Create them; fail when that is not permitted.
    Create,
    /// Create them; when not permitted (no CAP_MKNOD), leave them out and
    /// count them in [`UnpackStats::skipped_devices`].
    #[default]
    SkipIfDenied,
    /// Leave them all out, counted in [`UnpackStats::skipped_devices`]:
    /// what the image store does (as rootless Docker does). A sandbox's
    /// /dev is a fresh tmpfs of sifbox's own; a live node anywhere else in
    /// a tree on the host (root's unpack could make a `c 1 7`, /dev/port,
    /// in a store a lab group shares) is a door to the host's devices.
    Skip,
}

/// How [`unpack`] extracts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackOptions {
    pub owners: Owners,
    pub devices: DeviceNodes,
    /// Writing threads; 0 means one per CPU.
    pub threads: usize,
}

impl UnpackOptions {
    /// Options for an unprivileged caller: everything owned by the caller,
    /// device nodes skipped when they cannot be made.
    pub fn for_caller() -> Self {
        Self {
            owners: Owners::Caller,
            ..Self::default()
        }
    }
}

/// What [`unpack`] created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackStats {
    pub files: u64,
    /// Directories below the destination.
    pub dirs: u64,
    pub symlinks: u64,
    /// Extra names of an inode already extracted.
    pub hard_links: u64,
    pub devices: u64,
    /// Fifos and sockets.
    pub specials: u64,
    /// Device nodes left out (see [`DeviceNodes::SkipIfDenied`] and
    /// [`DeviceNodes::Skip`]).
    pub skipped_devices: u64,
    /// Bytes of regular file data.
    pub bytes: u64,
}

/// What [`verify_at`] checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyStats {
    /// Inodes reached from the root (the root included; hard links once).
    pub inodes: u64,
    pub files: u64,
    /// Directories below the root.
    pub dirs: u64,
    /// Extra names of an inode already reached.
    pub hard_links: u64,
    /// Bytes of regular file data decompressed and checked.
    pub bytes: u64,
}

/// Packs the tree under `dir` into a new squashfs image at `out`
/// (gzip, 128 KiB blocks, no extended attributes). Symlinks are recorded,
/// never followed. The same tree and options give the same bytes.
pub fn pack(dir: &Path, out: &Path, opts: &PackOptions) -> Result<PackStats, SquashError> {
    pack::pack(dir, out, opts)
}

/// Extracts the squashfs image file `image` into `dest` (created when
/// missing; must be empty otherwise).
pub fn unpack(image: &Path, dest: &Path, opts: &UnpackOptions) -> Result<UnpackStats, SquashError> {
    let file = File::open(image).map_err(|source| {
        SquashError::Io(crate::IoAt {
            op: "open",
            path: image.to_path_buf(),
            source,
        })
    })?;
    let len = file
        .metadata()
        .map_err(|source| {
            SquashError::Io(crate::IoAt {
                op: "stat",
                path: image.to_path_buf(),
                source,
            })
        })?
        .len();
    unpack::unpack(&file, 0, len, dest, opts)
}

/// Extracts the squashfs image stored at `offset..offset+len` of `file`
/// (a SIF partition, say) into `dest`, like [`unpack`].
pub fn unpack_at(
    file: &File,
    offset: u64,
    len: u64,
    dest: &Path,
    opts: &UnpackOptions,
) -> Result<UnpackStats, SquashError> {
    unpack::unpack(file, offset, len, dest, opts)
}

/// Checks the squashfs image stored at `offset..offset+len` of `file`
/// through without writing anything: every table, directory and inode it
/// reaches, and every data block and fragment decompressed to the size its
/// inode says, with the rules of [`unpack`]. An image that passes unpacks
/// (but for what the destination refuses: a full disk, devices). `threads`:
/// 0 for one per CPU.
///
/// # Errors
///
/// [`SquashError::Corrupt`], [`SquashError::NotSquashfs`] or
/// [`SquashError::UnsafeEntry`] for a damaged or crafted image,
/// [`SquashError::Unsupported`] for one sifbox does not read,
/// [`SquashError::Io`] when `file` cannot be read.
pub fn verify_at(
    file: &File,
    offset: u64,
    len: u64,
    threads: usize,
) -> Result<VerifyStats, SquashError> {
    verify::verify(file, offset, len, threads)
}

/// A change [`remix`] makes to an image's tree. Paths are relative to the
/// image's root (`a/b`; a leading `/` is ignored), plain names only; no
/// symlink on the way is followed (one there makes the edit
/// [`SquashError::Unsupported`], as does a file where a directory must be).
///
/// `Dir`, `File` and `FileIfMissing` write what Apptainer's layout needs,
/// with [`RemixOptions`]' time and owner, and give the directories they add
/// entries to that time. `DirAs` and `NewFile` give every attribute
/// themselves and touch nothing else: what a build's layers add to its base
/// (each parent comes first, with its own edit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// A directory, made (0755, with its missing parents) unless there.
    Dir { path: String },
    /// A regular file holding `data`, with permission bits `mode`: an
    /// existing regular file gets them in place (every name of it, its
    /// owner kept), as writing through it would; else a new file is made
    /// (missing parents too).
    File {
        path: String,
        data: Vec<u8>,
        mode: u16,
    },
    /// An empty regular file (0644), unless an entry of that name is there.
    FileIfMissing { path: String },
    /// A directory with `attrs`' mode and owner (`path` may name the root:
    /// `""` or `/`): made when missing (in a parent that is there), else
    /// the directory there, which must have
    /// that mode and owner already; either way its time becomes
    /// `attrs.mtime` (at most [`RemixOptions::time`]).
    /// [`SquashError::Unsupported`] when a parent is missing or not a
    /// directory, when something else is there, or when the mode or owner
    /// differ.
    DirAs { path: String, attrs: Attrs },
    /// A new regular file holding `data`, with `attrs` (time at most
    /// [`RemixOptions::time`]), in a directory that is there.
    /// [`SquashError::Unsupported`] when an entry of that name is there
    /// (nothing is replaced) or a parent is missing or not a directory.
    NewFile {
        path: String,
        data: FileSource,
        attrs: Attrs,
    },
}

impl Edit {
    /// The path the edit names.
    pub fn path(&self) -> &str {
        match self {
            Edit::Dir { path }
            | Edit::File { path, .. }
            | Edit::FileIfMissing { path }
            | Edit::DirAs { path, .. }
            | Edit::NewFile { path, .. } => path,
        }
    }
}

/// The attributes [`Edit::DirAs`] and [`Edit::NewFile`] give an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attrs {
    /// Permission bits, setuid, setgid and sticky (`0o7777`; others ignored).
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, whole seconds.
    pub mtime: u32,
}

/// The bytes of a file [`Edit::NewFile`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    Bytes(Vec<u8>),
    /// Read from an open file while the remix writes (not held in memory).
    Open(OpenFile),
}

impl FileSource {
    /// The number of bytes.
    pub fn len(&self) -> u64 {
        match self {
            FileSource::Bytes(b) => b.len() as u64,
            FileSource::Open(f) => f.size,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A regular file the caller opened, read from its start by offset (the
/// descriptor's position is not used). Its size is taken when it is
/// wrapped; a file whose size changes before the remix has read it makes
/// the remix fail ([`SquashError::Input`]). Equal when it is the same
/// handle.
#[derive(Clone)]
pub struct OpenFile {
    file: std::sync::Arc<File>,
    size: u64,
}

impl OpenFile {
    /// Wraps `file` (its size is read now).
    pub fn new(file: File) -> io::Result<Self> {
        let size = file.metadata()?.len();
        Ok(Self {
            file: std::sync::Arc::new(file),
            size,
        })
    }

    /// The size it had when it was wrapped.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file.
    pub fn as_file(&self) -> &File {
        &self.file
    }
}

impl PartialEq for OpenFile {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.file, &other.file)
    }
}

impl Eq for OpenFile {}

impl std::fmt::Debug for OpenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenFile")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// How [`remix`] writes the new image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemixOptions {
    /// The time of what the edits make or change (and of the directories
    /// they add entries to), the image's own time, and the newest time any
    /// entry keeps (newer ones get it, as [`PackOptions::clamp_mtime`]).
    pub time: u32,
    /// The (uid, gid) of entries the edits make (whatever their parent: a
    /// setgid directory gives its group only to what a file system makes).
    pub owner: (u32, u32),
    /// gzip level (0 to 9) of new data and the tables.
    pub compression_level: u32,
}

/// What [`remix`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemixStats {
    /// Inodes in the new image (hard links count once).
    pub inodes: u32,
    /// Bytes of the base's data region copied as they were.
    pub copied_bytes: u64,
    /// Bytes of file data the edits wrote (identical contents once).
    pub new_bytes: u64,
    /// Size of the image file, padded to 4 KiB.
    pub image_bytes: u64,
    /// Entries of the base whose time was newer than [`RemixOptions::time`]
    /// (now that time): none when the base's entries keep their times.
    pub clamped: u64,
    /// Regular files of the base with more than one name that an
    /// [`Edit::File`] wrote in place (each of their names sees the bytes).
    pub rewritten_links: u64,
}

/// Makes a new squashfs image at `out` from the one stored at
/// `offset..offset+len` of `file` (a SIF partition, say) with `edits`
/// applied, without decompressing or compressing its file data: the
/// base's data blocks and fragments are copied as they are, the files the
/// edits write are appended, and the tables are written anew. Everything
/// the edits leave alone keeps its type, permission bits, owner, content
/// and hard links; times are clamped to `opts.time`. The same base, edits
/// and options give the same bytes.
///
/// # Errors
///
/// [`SquashError::Unsupported`] when the base or an edit is one this cannot
/// do (not gzip, extended attributes, a symlink or file in an edit's way):
/// pack the edited tree instead. The errors of [`unpack`] for a damaged
/// base; [`SquashError::Io`] when `out` cannot be written.
pub fn remix(
    file: &File,
    offset: u64,
    len: u64,
    edits: &[Edit],
    opts: &RemixOptions,
    out: &Path,
) -> Result<RemixStats, SquashError> {
    remix::remix(file, offset, len, edits, opts, out)
}
