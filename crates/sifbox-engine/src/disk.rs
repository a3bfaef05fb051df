//! The disk-backed writable layer ([`Writable::Disk`]): an ext4 file system
//! of a fixed size, on a loop device, over a file with no name in a scratch
//! directory on the host's disk. Its size is enforced by the file system
//! (ENOSPC inside), its pages are the page cache's rather than a tmpfs's,
//! so a large layer pins no memory.
//!
//! Loop devices and ext4 mounts need host root. The outer supervisor makes
//! the layer while it is still in the host's namespaces ([`make`]) and init
//! attaches the detached mount as its writable layer. Nothing needs
//! cleaning up after, even after a SIGKILL: the backing file is made with
//! `O_TMPFILE` (no name, freed with its last user), the loop device clears
//! itself when the mount goes (`LO_FLAGS_AUTOCLEAR`), and the mount goes
//! with the sandbox's mount namespace (or with outer's fd, before init has
//! attached it).
//!
//! [`Writable::Disk`]: crate::spec::Writable::Disk

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::{Mode, OFlags};
use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, FsMountFlags,
    FsOpenFlags, MountAttrFlags,
};

use crate::error::{Error, Result};

pub(crate) mod error;
pub use error::DiskError;

/// Where the ext4 tool is looked for (a root shell's PATH has it, a
/// harness's environment may not).
const MKFS_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The mkfs.ext4 to run, if this host has one.
pub fn mkfs_path() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    MKFS_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(from_path)
        .map(|d| d.join("mkfs.ext4"))
        .find(|p| p.is_file())
}

/// Why this host (for this caller) cannot give a sandbox a disk-backed
/// layer, or `None` when it can.
pub fn unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some(
            "a disk-backed layer needs host root (a loop device and an ext4 mount); as this user the writable layer is a tmpfs, counted in the memory limit".into(),
        );
    }
    // Root of a user namespace (a rootless container) cannot set up loop
    // devices; only the host's own namespace maps every id to itself.
    let initial = std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]);
    if !initial {
        return Some(
            "a disk-backed layer needs root of the host's user namespace, and this is one of a container's".into(),
        );
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (load the loop module: modprobe loop)".into());
    }
    if mkfs_path().is_none() {
        return Some("mkfs.ext4 is not installed (apt install e2fsprogs)".into());
    }
    None
}

/// The scratch directory for disk-backed layers: `$SIFBOX_SCRATCH`, else
/// `default` (the CLI gives `<store>/scratch`). Made 0700 if missing.
pub fn scratch_dir(default: &Path) -> PathBuf {
    std::env::var_os("SIFBOX_SCRATCH")
        .filter(|p| !p.is_empty())
        .map_or_else(|| default.to_path_buf(), PathBuf::from)
}

/// Makes `dir` (0700) if it does not exist, and checks it is private:
/// the caller's, mode 0700 (see [`open_scratch`]).
pub fn prepare_scratch(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|source| DiskError::ScratchParent {
                dir: dir.to_path_buf(),
                source,
            })?;
    }
    open_scratch(dir, true).map(drop)
}

/// Opens the scratch directory once, by its descriptor: it must be the
/// caller's alone (mode 0700, no symlink), or the caller's and sticky, and
/// no other user may be able to swap a directory above it; what a sandbox's disk layer is made of
/// lives there. `create`: make it when missing.
pub fn open_scratch(dir: &Path, create: bool) -> Result<OwnedFd> {
    sifbox_sys::check_ancestors(dir).map_err(|source| DiskError::ScratchAncestors {
        dir: dir.to_path_buf(),
        source,
    })?;
    // A dir of the caller's that others may write in but not rename in
    // (sticky, as /tmp) is used as it is: a layer is a nameless file there
    // (O_TMPFILE), and no template, a named file, is made in it.
    if let Ok(fd) = sifbox_sys::beneath::open_dir(rustix::fs::CWD, dir) {
        if let Ok(st) = rustix::fs::fstat(&fd) {
            if st.st_uid == rustix::process::geteuid().as_raw() && st.st_mode & 0o1000 != 0 {
                return Ok(fd);
            }
        }
    }
    sifbox_sys::private_dir(rustix::fs::CWD, dir, create).map_err(|e| {
        let dir = dir.to_path_buf();
        match sifbox_sys::NotPrivate::of(&e) {
            Some(n) => DiskError::ScratchNotPrivate {
                dir,
                why: n.why.clone(),
            },
            None => DiskError::ScratchOpen { dir, source: e },
        }
        .into()
    })
}

fn setup_err(what: impl std::fmt::Display) -> impl FnOnce(rustix::io::Errno) -> Error {
    move |e| Error::syscall(what.to_string(), e)
}

/// Makes a `size_mib` ext4 file system in a nameless file in `scratch`,
/// its root directory owned by `owner` (host ids), on a loop device, and
/// mounts it detached (nosuid, nodev); returns the mount.
///
/// The file system is a copy of a template made once per size and
/// mkfs.ext4 ([`Template`]): copying its few hundred KiB of metadata takes
/// a fraction of a millisecond, running mkfs some (`sifbox run --disk 10g
/// IMAGE true`, median of 30, the two alternated: 10.7 ms with the
/// template, 12.9 with mkfs each time).
///
/// The device reads and writes the file through the host's page cache,
/// not with direct I/O: what a short rollout writes often never reaches
/// the disk, the file being freed first (eval overhead per rollout,
/// median: 25 ms buffered, 33 ms direct, 11 ms on a tmpfs).
pub fn make(size_mib: u64, scratch: &Path, owner: (u32, u32), mkfs: &Path) -> Result<OwnedFd> {
    let where_ = || format!("the disk-backed layer in {}", scratch.display());
    let dir = open_scratch(scratch, false)?;
    let bytes = size_mib.saturating_mul(1 << 20);
    let template = Template::new(&dir, size_mib, mkfs);
    // A template that does not mount is removed, and the layer made anew
    // by mkfs (once).
    let from_template = template.as_ref().and_then(|t| {
        let file = nameless(&dir, bytes, &where_).ok()?;
        t.copy_into(&file, mkfs).ok()?;
        match mount(file, owner) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(
                    "{}: the ext4 template did not mount ({e}): made anew",
                    where_()
                );
                t.remove();
                None
            }
        }
    });
    if let Some(m) = from_template {
        return Ok(m);
    }
    let file = nameless(&dir, bytes, &where_)?;
    format(&file, mkfs).map_err(|why| DiskError::Format {
        place: where_(),
        why,
    })?;
    mount(file, owner)
}

/// A disk-backed file system that serves one sandbox after another, each
/// in a directory of its own that is removed before the next one starts:
/// an eval worker's. Making, mounting, unmounting and freeing an ext4 for
/// every sandbox costs some 2.5 ms of CPU (the loop device, the mount, the
/// unmount's writeback, freeing the backing file); a directory costs a
/// mkdir and its removal.
///
/// One sandbox at a time: [`Reused::layer`] refuses while the last
/// layer's directory is there (its [`Layer::remove`] not yet done), so a
/// sandbox never shares the file system with another one, and what an
/// earlier one wrote is gone before a later one starts (its blocks are
/// free space, which ext4 never shows as file contents). A sandbox sees
/// only its directory (the bind mount of it is its writable layer), and
/// the file system's size is all its own, as a layer of its own would be.
#[derive(Debug)]
pub struct Reused {
    fs: std::sync::Arc<OwnedFd>,
    size_mib: u64,
    next: u64,
    /// The name of the directory of the layer in use, if any.
    in_use: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

/// A sandbox's layer on a [`Reused`] file system: the detached bind mount
/// of its directory (the supervisor's, see
/// [`crate::StartOptions::disk_layer`]) and what removes the directory.
#[derive(Debug)]
pub struct Layer {
    pub mount: OwnedFd,
    removal: Removal,
}

/// Removes a [`Layer`]'s directory once the sandbox that used it is gone.
#[derive(Debug)]
pub struct Removal {
    fs: std::sync::Arc<OwnedFd>,
    name: String,
    in_use: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Reused {
    /// A `size_mib` ext4 file system (a copy of the template, as [`make`]),
    /// its root host root's.
    pub fn new(size_mib: u64, scratch: &Path, mkfs: &Path) -> Result<Reused> {
        // Its root stays root's; no sandbox sees it, only its directory.
        let fs = make(size_mib, scratch, (0, 0), mkfs)?;
        Ok(Reused {
            fs: std::sync::Arc::new(fs),
            size_mib,
            next: 0,
            in_use: std::sync::Arc::default(),
        })
    }

    /// The file system's size.
    pub fn size_mib(&self) -> u64 {
        self.size_mib
    }

    /// Whether the last layer's directory has been removed.
    pub fn free(&self) -> bool {
        self.in_use
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }

    /// A new layer: a fresh directory owned by `owner` (host ids), as a
    /// detached bind mount (nosuid, nodev).
    pub fn layer(&mut self, owner: (u32, u32)) -> Result<Layer> {
        let mut in_use = self
            .in_use
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(name) = in_use.as_ref() {
            return Err(DiskError::LayerNotRemoved(name.clone()).into());
        }
        self.next += 1;
        let name = format!("s{}", self.next);
        rustix::fs::mkdirat(&*self.fs, name.as_str(), Mode::from_raw_mode(0o755)).map_err(
            setup_err(format!("the disk-backed file system: mkdir {name}")),
        )?;
        *in_use = Some(name.clone());
        drop(in_use);
        let removal = Removal {
            fs: self.fs.clone(),
            name: name.clone(),
            in_use: self.in_use.clone(),
        };
        let made = (|| {
            let dir = sifbox_sys::beneath::open_dir_path(&*self.fs, name.as_str())
                .map_err(setup_err("the disk-backed file system: opening the layer"))?;
            rustix::fs::chownat(
                &dir,
                "",
                Some(rustix::process::Uid::from_raw(owner.0)),
                Some(rustix::process::Gid::from_raw(owner.1)),
                rustix::fs::AtFlags::EMPTY_PATH,
            )
            .map_err(setup_err(
                "the disk-backed file system: giving the layer to the sandbox",
            ))?;
            rustix::mount::open_tree(
                &dir,
                "",
                rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
                    | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | rustix::mount::OpenTreeFlags::AT_EMPTY_PATH,
            )
            .map_err(setup_err(
                "the disk-backed file system: a bind mount of the layer",
            ))
        })();
        match made {
            Ok(mount) => Ok(Layer { mount, removal }),
            Err(e) => {
                let _ = removal.remove();
                Err(e)
            }
        }
    }
}

impl Layer {
    /// The mount (for the sandbox) and what removes the directory after.
    pub fn split(self) -> (OwnedFd, Removal) {
        (self.mount, self.removal)
    }
}

impl Removal {
    /// Removes the layer's directory and all in it, without following a
    /// symlink (std's `remove_dir_all` goes by fds, `O_NOFOLLOW`). Only
    /// once no process of the sandbox is left: nothing then can change
    /// the tree while it goes. On failure the file system stays taken (no
    /// later layer), and the caller makes another.
    pub fn remove(self) -> std::io::Result<()> {
        let path = PathBuf::from(format!("/proc/self/fd/{}", self.fs.as_raw_fd())).join(&self.name);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        *self
            .in_use
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        Ok(())
    }
}

/// A new file of `bytes` (sparse) with no name in `dir`.
fn nameless(dir: &OwnedFd, bytes: u64, where_: &dyn Fn() -> String) -> Result<OwnedFd> {
    let file = rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| DiskError::Nameless {
        place: where_(),
        source: e.into(),
    })?;
    rustix::fs::ftruncate(&file, bytes)
        .map_err(setup_err(format!("{}: sizing the file", where_())))?;
    Ok(file)
}

/// Mounts the ext4 file system in `file` on a loop device, detached
/// (nosuid, nodev), its root directory given to `owner`.
fn mount(file: OwnedFd, owner: (u32, u32)) -> Result<OwnedFd> {
    let dev = sifbox_sys::attach_loop(file.as_fd())?;
    drop(file);
    let ctx = fsopen("ext4", FsOpenFlags::FSOPEN_CLOEXEC).map_err(setup_err("fsopen(ext4)"))?;
    let source = format!("/proc/self/fd/{}", dev.as_raw_fd());
    fsconfig_set_string(&ctx, "source", source.as_str())
        .map_err(setup_err("the disk-backed layer: ext4 source"))?;
    // The inode tables stay unwritten: no lazy-init thread writes behind
    // the sandbox's back.
    let _ = fsconfig_set_flag(&ctx, "noinit_itable");
    // No cache flushes: the layer dies with the sandbox, so an fsync inside
    // (dpkg makes hundreds) need not reach the host's disk (200 small
    // fsynced writes: 270 ms with barriers, 210 without, 170 on a tmpfs).
    let _ = fsconfig_set_flag(&ctx, "nobarrier");
    // No discards either: blocks freed inside need not be punched out of a
    // file that goes whole with the sandbox. (Freeing that file on a host
    // file system mounted `discard` costs a waited-for discard per extent,
    // some 75 us each, when the sandbox stops.)
    let _ = fsconfig_set_flag(&ctx, "nodiscard");
    fsconfig_create(&ctx).map_err(setup_err("the disk-backed layer: mounting ext4"))?;
    let m = fsmount(
        &ctx,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(setup_err("the disk-backed layer: fsmount(ext4)"))?;
    // The mount holds the device now; it detaches itself after it.
    drop(dev);
    // mkfs made the root directory root's (the template serves every
    // owner); lost+found stays root's, as mkfs's root_owner leaves it.
    rustix::fs::chownat(
        &m,
        "",
        Some(rustix::process::Uid::from_raw(owner.0)),
        Some(rustix::process::Gid::from_raw(owner.1)),
        rustix::fs::AtFlags::EMPTY_PATH,
    )
    .map_err(setup_err(
        "the disk-backed layer: giving its root to the sandbox",
    ))?;
    Ok(m)
}

/// An empty ext4 file system of one size as mkfs.ext4 makes it ([`format`]),
/// kept in the scratch directory under a name that says the size and which
/// mkfs.ext4 (and mke2fs.conf) made it: a new layer is a copy of its data
/// extents. Host root's alone: the scratch directory must be the caller's
/// and writable by nobody else (else there is no template: mkfs makes
/// each layer), the template the caller's, 0600, one link, of the size,
/// with ext4's magic (else it is made anew in its place). Nothing of a
/// sandbox ever reaches this file: it is only read, never mounted.
struct Template<'d> {
    dir: &'d OwnedFd,
    name: String,
    bytes: u64,
}

/// Bumped when [`format`]'s options change (old templates are then
/// ignored, and `sifbox gc` removes them: [`gc_templates`]).
const TEMPLATE_FORMAT: u32 = 1;

/// The prefix of templates' names in the scratch directory.
pub const TEMPLATE_PREFIX: &str = ".ext4-template-";

impl<'d> Template<'d> {
    /// The template for `size_mib` in `dir`, when `dir` may hold one.
    fn new(dir: &'d OwnedFd, size_mib: u64, mkfs: &Path) -> Option<Self> {
        let me = rustix::process::geteuid();
        let st = rustix::fs::fstat(dir).ok()?;
        if st.st_uid != me.as_raw() || st.st_mode & 0o022 != 0 {
            return None;
        }
        Some(Template {
            dir,
            name: format!("{TEMPLATE_PREFIX}{size_mib}m-{}", template_key(mkfs)),
            bytes: size_mib.saturating_mul(1 << 20),
        })
    }

    /// Copies the template into `file` (of its size), making the
    /// template first when there is none.
    fn copy_into(&self, file: &OwnedFd, mkfs: &Path) -> std::result::Result<(), String> {
        let src = match self.open() {
            Some(src) => src,
            None => self.make(mkfs)?,
        };
        copy_extents(&src, file, self.bytes).map_err(|e| format!("copying the template: {e}"))
    }

    /// The template, when there is one this may use.
    fn open(&self) -> Option<OwnedFd> {
        let fd = rustix::fs::openat(
            self.dir,
            self.name.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        let ours = rustix::fs::FileType::from_raw_mode(st.st_mode).is_file()
            && st.st_uid == rustix::process::geteuid().as_raw()
            && st.st_mode & 0o077 == 0
            && st.st_nlink == 1
            && u64::try_from(st.st_size).ok() == Some(self.bytes);
        // ext4's magic in the superblock.
        let mut magic = [0u8; 2];
        let magic_ok =
            rustix::io::pread(&fd, &mut magic, 1024 + 56).ok() == Some(2) && magic == [0x53, 0xef];
        (ours && magic_ok).then_some(fd)
    }

    /// Runs mkfs into a nameless file and gives it the template's name, in
    /// place of whatever had it (a template this would not use; another
    /// process making one at the same time: either serves).
    fn make(&self, mkfs: &Path) -> std::result::Result<OwnedFd, String> {
        let file = nameless(self.dir, self.bytes, &|| "the ext4 template".to_string())
            .map_err(|e| e.to_string())?;
        format(&file, mkfs)?;
        // Named only once it is whole on disk.
        rustix::fs::fsync(&file).map_err(|e| format!("fsync of the template: {e}"))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let temp = format!("{}.{}.{nanos}", self.name, std::process::id());
        let kept = rustix::fs::linkat(
            &file,
            "",
            self.dir,
            temp.as_str(),
            rustix::fs::AtFlags::EMPTY_PATH,
        )
        .and_then(|()| {
            rustix::fs::renameat(self.dir, temp.as_str(), self.dir, self.name.as_str()).inspect_err(
                |_| {
                    let _ =
                        rustix::fs::unlinkat(self.dir, temp.as_str(), rustix::fs::AtFlags::empty());
                },
            )
        });
        if let Err(e) = kept {
            tracing::debug!("the ext4 template {}: not kept ({e})", self.name);
        }
        Ok(file)
    }

    fn remove(&self) {
        let _ = rustix::fs::unlinkat(self.dir, self.name.as_str(), rustix::fs::AtFlags::empty());
    }
}

/// The end of the names of the templates `mkfs` makes, as it is now:
/// another e2fsprogs (or mke2fs.conf) makes other templates.
fn template_key(mkfs: &Path) -> String {
    let mut key = Fnv::new();
    key.add(&TEMPLATE_FORMAT.to_le_bytes());
    for p in [mkfs, Path::new("/etc/mke2fs.conf")] {
        key.add(p.as_os_str().as_encoded_bytes());
        if let Ok(st) = rustix::fs::stat(p) {
            for v in [
                st.st_dev,
                st.st_ino,
                u64::try_from(st.st_size).unwrap_or(0),
                u64::try_from(st.st_mtime).unwrap_or(0),
                st.st_mtime_nsec,
            ] {
                key.add(&v.to_le_bytes());
            }
        }
    }
    format!("{:016x}", key.0)
}

/// Removes from the scratch dir `scratch` the ext4 templates this host's
/// mkfs.ext4 would not use (another e2fsprogs, another sifbox's format)
/// and the leftovers of ones being made more than a minute ago; returns
/// what it removed. Only in a dir that is the caller's alone.
pub fn gc_templates(scratch: &Path) -> Vec<PathBuf> {
    let Ok(dir) = sifbox_sys::beneath::open_dir(rustix::fs::CWD, scratch) else {
        return Vec::new();
    };
    let ours = rustix::fs::fstat(&dir).is_ok_and(|st| {
        st.st_uid == rustix::process::geteuid().as_raw() && st.st_mode & 0o022 == 0
    });
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
        return Vec::new();
    };
    if !ours {
        return Vec::new();
    }
    let key = mkfs_path().map(|m| template_key(&m));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(TEMPLATE_PREFIX) else {
            continue;
        };
        let current = key.as_ref().is_some_and(|k| {
            rest.strip_suffix(k.as_str())
                .and_then(|size| size.strip_suffix("m-"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        if current {
            continue;
        }
        let Ok(st) = rustix::fs::statat(&dir, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        else {
            continue;
        };
        let half_made = rest.contains('.');
        if half_made && now.saturating_sub(u64::try_from(st.st_mtime).unwrap_or(0)) < 60 {
            continue;
        }
        if rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty()).is_ok() {
            removed.push(scratch.join(&name));
        }
    }
    removed
}

/// Copies the data extents of `src` (of `len` bytes) to the same offsets
/// of `dst`, whose other bytes are holes: what mkfs wrote, without the
/// gigabytes of zeros between.
fn copy_extents(src: &OwnedFd, dst: &OwnedFd, len: u64) -> std::io::Result<()> {
    use rustix::fs::SeekFrom;
    let mut at = 0u64;
    while at < len {
        let data = match rustix::fs::seek(src, SeekFrom::Data(at)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(src, SeekFrom::Hole(data))?.min(len);
        let (mut from, mut to) = (data, data);
        while from < end {
            let want = usize::try_from(end - from).unwrap_or(usize::MAX);
            let n = rustix::fs::copy_file_range(src, Some(&mut from), dst, Some(&mut to), want)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the template ended early",
                ));
            }
        }
        at = end;
    }
    Ok(())
}

/// 64-bit FNV-1a: the templates' names (a cache key, not a defence).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn add(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Runs mkfs.ext4 on `file` (its stdin): no journal (the layer dies with
/// the sandbox), no blocks reserved for growing it or for root, inode
/// tables initialised lazily and nothing discarded, so that mkfs writes
/// some hundred KiB and takes some milliseconds even for 100 GiB (13 ms
/// for 10 GiB with the resize inode, 5 without).
fn format(file: &OwnedFd, mkfs: &Path) -> std::result::Result<(), String> {
    let stdin = file
        .try_clone()
        .map_err(|e| format!("duplicating the file: {e}"))?;
    let out = Command::new(mkfs)
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-b",
            "4096",
            "-O",
            "^has_journal,^resize_inode",
            "-E",
        ])
        .arg("lazy_itable_init=1,nodiscard,root_owner=0:0")
        .arg("/dev/stdin")
        .env_clear()
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("running {}: {e}", mkfs.display()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} failed ({}): {}",
        mkfs.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}
