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

/// Makes `dir` (0700) if it does not exist; it must be a directory.
pub fn prepare_scratch(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(Error::BadInput {
            what: format!("the scratch directory {}", dir.display()),
            why: format!("cannot make it: {e}"),
            fix: "set SIFBOX_SCRATCH to a directory on a local disk".into(),
        }),
    }
}

fn setup_err(what: impl std::fmt::Display) -> impl FnOnce(rustix::io::Errno) -> Error {
    move |e| Error::syscall(what.to_string(), e)
}

/// Makes a `size_mib` ext4 file system in a nameless file in `scratch`,
/// its root directory owned by `owner` (host ids), on a loop device, and
/// mounts it detached (nosuid, nodev); returns the mount.
///
/// The device reads and writes the file through the host's page cache,
/// not with direct I/O: what a short rollout writes often never reaches
/// the disk, the file being freed first (eval overhead per rollout,
/// median: 25 ms buffered, 33 ms direct, 11 ms on a tmpfs).
pub fn make(size_mib: u64, scratch: &Path, owner: (u32, u32), mkfs: &Path) -> Result<OwnedFd> {
    let where_ = || format!("the disk-backed layer in {}", scratch.display());
    let dir = rustix::fs::open(
        scratch,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(setup_err(format!("{}: opening the directory", where_())))?;
    let file = rustix::fs::openat(
        &dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| {
        Error::Setup(format!(
            "{}: making a nameless file (O_TMPFILE): {}; put SIFBOX_SCRATCH on a local ext4 or xfs",
            where_(),
            std::io::Error::from(e)
        ))
    })?;
    rustix::fs::ftruncate(&file, size_mib.saturating_mul(1 << 20))
        .map_err(setup_err(format!("{}: sizing the file", where_())))?;
    format(&file, owner, mkfs).map_err(|why| Error::Setup(format!("{}: {why}", where_())))?;
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
    fsconfig_create(&ctx).map_err(setup_err("the disk-backed layer: mounting ext4"))?;
    let m = fsmount(
        &ctx,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(setup_err("the disk-backed layer: fsmount(ext4)"))?;
    // The mount holds the device now; it detaches itself after it.
    drop(dev);
    Ok(m)
}

/// Runs mkfs.ext4 on `file` (its stdin): no journal (the layer dies with
/// the sandbox), no blocks reserved for growing it or for root, inode
/// tables initialised lazily and nothing discarded, so that mkfs writes
/// some hundred KiB and takes some milliseconds even for 100 GiB (13 ms
/// for 10 GiB with the resize inode, 5 without).
fn format(file: &OwnedFd, owner: (u32, u32), mkfs: &Path) -> std::result::Result<(), String> {
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
        .arg(format!(
            "lazy_itable_init=1,nodiscard,root_owner={}:{}",
            owner.0, owner.1
        ))
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
