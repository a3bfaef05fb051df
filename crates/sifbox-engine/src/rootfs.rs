//! Assembling a sandbox's root file system inside its private mount namespace.
//!
//! Runs in the supervisor (init) after it unshared the mount namespace,
//! before pivot_root, in two halves:
//!
//! - [`plan`] turns a [`SandboxSpec`] into a list of [`Step`]s: data, made
//!   without a system call, unit-tested without privileges.
//! - [`apply`] carries the steps out, every one relative to a file
//!   descriptor: the overlay root, or a mount that an earlier step made.
//!
//! The image is hostile. Where it may shape a path (a bind's destination,
//! `/tmp`), the path is resolved with `openat2(RESOLVE_IN_ROOT)`, so its
//! symlinks are followed as if the root were `/` and never lead out. Where
//! sifbox mounts its own file systems (`/proc`, `/dev`, `/sys`), the image
//! must have a plain directory (`RESOLVE_NO_SYMLINKS`), or the start fails
//! naming the path. Covers and masks inside those mounts are looked up
//! beneath the mount's own fd, without following anything, and a cover that
//! cannot be applied fails the start. File systems are made with
//! `fsopen`/`fsmount` and binds with `open_tree`, made read-only while
//! detached, then attached with `move_mount`: nothing is mounted by a path
//! name the image could have redirected.
//!
//! The writable layer and the overlay (prepared by [`prepare_root`]) live
//! on a tmpfs (or the disk-backed ext4 of [`crate::disk`]) at `m/` in the
//! runtime dir that only this mount namespace sees; the overlay's layers are named to the kernel as `/proc/self/fd/N`,
//! so no host path shows in the sandbox's `/proc/self/mountinfo`.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;
use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, mount_change,
    move_mount, open_tree, unmount, FsMountFlags, FsOpenFlags, MountAttrFlags,
    MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};
use sifbox_sys::beneath;

use crate::error::{Error, Result};
use crate::spec::{NetMode, SandboxSpec, Writable};

/// The mounts that later steps look paths up beneath.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Base {
    /// The overlay root.
    Root,
    /// The sandbox's `/proc`.
    Proc,
    /// The sandbox's `/dev` tmpfs.
    Dev,
    /// The sandbox's `/sys`.
    Sys,
}

/// What to create when a looked-up path is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    Dir,
    File,
    /// Whatever the bind's source is.
    LikeSource,
}

/// How a step's path is looked up beneath its base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// A path the image may shape: symlinks are followed as if the root
    /// were `/` (`RESOLVE_IN_ROOT`); what is missing is created.
    Image(Create),
    /// A directory of the image itself: no symlink on the way and a
    /// directory at the end (made when missing); anything else fails the
    /// start.
    RealDir,
    /// Exactly this path beneath one of sifbox's own mounts, following
    /// nothing; when it (or the mount) is absent the step is skipped: there
    /// is nothing to cover.
    IfPresent,
    /// Made anew beneath one of sifbox's own mounts (dir or file).
    New(Create),
}

/// Where a step acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub base: Base,
    /// Relative to the base: plain names only (no `/`, `.`, `..` parts).
    pub path: PathBuf,
    pub lookup: Lookup,
}

impl At {
    fn new(base: Base, path: &str, lookup: Lookup) -> At {
        At {
            base,
            path: relative(Path::new(path)),
            lookup,
        }
    }

    /// The path as the sandbox will see it, for messages.
    pub fn shown(&self) -> String {
        let base = match self.base {
            Base::Root => "",
            Base::Proc => "/proc",
            Base::Dev => "/dev",
            Base::Sys => "/sys",
        };
        if self.path.as_os_str().is_empty() {
            return if base.is_empty() {
                "/".into()
            } else {
                base.into()
            };
        }
        format!("{base}/{}", self.path.display())
    }
}

/// A file system sifbox makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fs {
    /// `size` in bytes.
    Tmpfs {
        mode: u32,
        size: u64,
    },
    Proc,
    Devpts,
}

/// Mount attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

impl Attrs {
    const NOSUID_NODEV_NOEXEC: Attrs = Attrs {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: true,
    };

    fn flags(self) -> MountAttrFlags {
        let mut f = MountAttrFlags::empty();
        for (on, flag) in [
            (self.readonly, MountAttrFlags::MOUNT_ATTR_RDONLY),
            (self.nosuid, MountAttrFlags::MOUNT_ATTR_NOSUID),
            (self.nodev, MountAttrFlags::MOUNT_ATTR_NODEV),
            (self.noexec, MountAttrFlags::MOUNT_ATTR_NOEXEC),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }
}

/// What a host bind may do when it cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any failure fails the start.
    Required,
    /// Skipped when the host has no such path; other failures fail the start.
    IfOnHost,
    /// Skipped on any failure (the host's DNS files: a convenience).
    BestEffort,
}

/// One step of assembling the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A fresh file system at `at`; with `names`, later steps look paths up
    /// beneath it.
    Mount {
        fs: Fs,
        at: At,
        attrs: Attrs,
        names: Option<Base>,
    },
    /// The sandbox's `/sys`: a fresh read-only sysfs when the sandbox has
    /// its own network namespace, else the host's bound read-only; left
    /// empty when the kernel allows neither.
    Sys { at: At, own_netns: bool },
    /// A host path (the caller's choice, so its own symlinks are followed)
    /// bound recursively at `at`, made read-only while still detached.
    BindHost {
        src: PathBuf,
        at: At,
        readonly: bool,
        need: Need,
    },
    /// A guarded bind (see [`crate::spec::GuardedBind`]): the host
    /// directory `src` bound read-only at `at`, and a second, writable
    /// clone of it kept detached ([`NewRoot::take_guarded`]) for the
    /// guarded mount namespace, to be mounted at `dst` there.
    Guarded { src: PathBuf, at: At, dst: PathBuf },
    /// The sandbox's `/sys/fs/cgroup`: only its own cgroup, each of
    /// `views` (a name below `at`, "" for `at` itself, and the host's
    /// directory of the sandbox's cgroup there) bound read-only in a
    /// read-only tmpfs; with no views, an empty read-only tmpfs.
    CgroupView {
        at: At,
        views: Vec<(String, PathBuf)>,
    },
    /// The subtree at `at` covered by a read-only bind of itself.
    ReadOnly { at: At },
    /// `at` hidden: a file under the host's /dev/null, a directory under an
    /// empty read-only tmpfs.
    Mask { at: At },
    /// A directory with `mode`, made only when missing.
    MakeDir { at: At, mode: u32 },
    /// A file of the sandbox's own with `contents`, writable by its root:
    /// made in a small fresh tmpfs and bound over `at` (as Docker binds
    /// its `/etc/hosts`), so the image's file is left as it was.
    File { at: At, contents: Vec<u8> },
    /// A symlink to `target`.
    Symlink { at: At, target: PathBuf },
    /// The writable layer's directory `name` (beside the overlay's upper
    /// and work dirs, seen nowhere else) bound at `at`: what is written
    /// there counts against the layer's size.
    LayerDir { name: String, at: At },
}

/// Size of the tmpfs of a [`Step::File`].
const FILE_TMPFS_BYTES: u64 = 64 << 10;

/// The `/etc/hosts` of a sandbox with a network of its own (`--net none`):
/// the loopback names and the sandbox's host name, as Docker writes one,
/// for programs that connect to `localhost` (test servers, verifiers; an
/// image's own file is often empty, Docker having bound one over it).
pub fn own_hosts(hostname: &str) -> Vec<u8> {
    let mut out = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    if !hostname.is_empty() && hostname != "localhost" {
        out.push_str(&format!("127.0.1.1\t{hostname}\n"));
    }
    out.into_bytes()
}

/// Host-wide knobs of /proc, covered read-only (Docker's list).
pub const PROC_READ_ONLY: &[&str] = &["bus", "fs", "irq", "sys", "sysrq-trigger"];
/// Files and dirs of /proc that expose the host's kernel state, masked.
pub const PROC_MASKED: &[&str] = &[
    "acpi",
    "asound",
    "kcore",
    "keys",
    "latency_stats",
    "sched_debug",
    "scsi",
    "timer_list",
    "timer_stats",
];
/// Parts of /sys that expose firmware tables and energy counters, masked.
pub const SYS_MASKED: &[&str] = &["firmware", "devices/virtual/powercap"];
/// Host devices bound into /dev.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Size of the /dev tmpfs (only nodes and links live there).
const DEV_TMPFS_BYTES: u64 = 1 << 20;

/// The steps that assemble `spec`'s root on top of its overlay.
pub fn plan(spec: &SandboxSpec) -> Vec<Step> {
    let mut steps = Vec::new();
    // /proc: a fresh proc of the sandbox's pid namespace.
    steps.push(Step::Mount {
        fs: Fs::Proc,
        at: At::new(Base::Root, "proc", Lookup::RealDir),
        attrs: Attrs::NOSUID_NODEV_NOEXEC,
        names: Some(Base::Proc),
    });
    for p in PROC_READ_ONLY {
        steps.push(Step::ReadOnly {
            at: At::new(Base::Proc, p, Lookup::IfPresent),
        });
    }
    for p in PROC_MASKED {
        steps.push(Step::Mask {
            at: At::new(Base::Proc, p, Lookup::IfPresent),
        });
    }
    // /dev: a 0755 tmpfs (with the sticky 1777 default, `>` onto the
    // bound /dev/null fails), the harmless host devices, a private devpts,
    // /dev/shm, and the fd links.
    steps.push(Step::Mount {
        fs: Fs::Tmpfs {
            mode: 0o755,
            size: DEV_TMPFS_BYTES,
        },
        at: At::new(Base::Root, "dev", Lookup::RealDir),
        attrs: Attrs {
            nosuid: true,
            noexec: true,
            ..Attrs::default()
        },
        names: Some(Base::Dev),
    });
    for node in DEV_NODES {
        steps.push(Step::BindHost {
            src: Path::new("/dev").join(node),
            at: At::new(Base::Dev, node, Lookup::New(Create::File)),
            readonly: false,
            need: Need::IfOnHost,
        });
    }
    steps.push(Step::Mount {
        fs: Fs::Devpts,
        at: At::new(Base::Dev, "pts", Lookup::New(Create::Dir)),
        attrs: Attrs {
            nosuid: true,
            noexec: true,
            ..Attrs::default()
        },
        names: None,
    });
    steps.push(Step::Mount {
        fs: Fs::Tmpfs {
            mode: 0o1777,
            size: spec.shm_bytes,
        },
        at: At::new(Base::Dev, "shm", Lookup::New(Create::Dir)),
        attrs: Attrs::NOSUID_NODEV_NOEXEC,
        names: None,
    });
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        steps.push(Step::Symlink {
            at: At::new(Base::Dev, link, Lookup::New(Create::File)),
            target: PathBuf::from(to),
        });
    }
    // /sys, read-only either way.
    steps.push(Step::Sys {
        at: At::new(Base::Root, "sys", Lookup::RealDir),
        own_netns: spec.net == NetMode::None,
    });
    for p in SYS_MASKED {
        steps.push(Step::Mask {
            at: At::new(Base::Sys, p, Lookup::IfPresent),
        });
    }
    // /tmp is the image's, in the writable layer (so it counts against its
    // size), made world-writable when the image has none.
    steps.push(Step::MakeDir {
        at: At::new(Base::Root, "tmp", Lookup::Image(Create::Dir)),
        mode: 0o1777,
    });
    if spec.host_dns && spec.net == NetMode::Host {
        for f in ["/etc/resolv.conf", "/etc/hosts"] {
            steps.push(Step::BindHost {
                src: PathBuf::from(f),
                at: At::new(Base::Root, f, Lookup::Image(Create::File)),
                readonly: true,
                need: Need::BestEffort,
            });
        }
    }
    if spec.net == NetMode::None {
        steps.push(Step::File {
            at: At::new(Base::Root, "etc/hosts", Lookup::Image(Create::File)),
            contents: own_hosts(&spec.hostname),
        });
    }
    for b in &spec.binds {
        steps.push(Step::BindHost {
            src: b.src.clone(),
            at: At {
                base: Base::Root,
                path: relative(&b.dst),
                lookup: Lookup::Image(Create::LikeSource),
            },
            readonly: b.readonly,
            need: Need::Required,
        });
    }
    for t in &spec.tmpfs {
        steps.push(Step::Mount {
            fs: Fs::Tmpfs {
                mode: t.mode,
                size: t.size,
            },
            at: At {
                base: Base::Root,
                path: relative(&t.dst),
                lookup: Lookup::Image(Create::Dir),
            },
            attrs: Attrs {
                nosuid: true,
                nodev: true,
                ..Attrs::default()
            },
            names: None,
        });
    }
    for (i, p) in spec.layer_dirs.iter().enumerate() {
        steps.push(Step::LayerDir {
            name: layer_dir_name(i),
            at: At {
                base: Base::Root,
                path: relative(p),
                lookup: Lookup::Image(Create::Dir),
            },
        });
    }
    // Last: a guarded bind may lie below a bind (/logs/verifier below
    // /logs).
    for g in &spec.guarded {
        steps.push(Step::Guarded {
            src: g.src.clone(),
            at: At {
                base: Base::Root,
                path: relative(&g.dst),
                lookup: Lookup::Image(Create::Dir),
            },
            dst: g.dst.clone(),
        });
    }
    steps
}

/// The name in the writable layer of the `i`th of `SandboxSpec::layer_dirs`.
fn layer_dir_name(i: usize) -> String {
    format!("d{i}")
}

/// `/a/b` -> `a/b`, dropping `.`; `..` is kept for the Image lookup, which
/// clamps it at the root (RESOLVE_IN_ROOT), and refused by the strict ones.
fn relative(inside: &Path) -> PathBuf {
    inside
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            Component::ParentDir => Some(std::ffi::OsStr::new("..")),
            _ => None,
        })
        .collect()
}

fn sys_err(what: impl std::fmt::Display) -> impl FnOnce(Errno) -> Error {
    move |e| Error::syscall(what.to_string(), e)
}

/// The root being assembled: the overlay mount and the mounts made on it.
#[derive(Debug)]
pub struct NewRoot {
    /// The overlay's root directory.
    fd: OwnedFd,
    /// The mounts of [`Base`]s other than the root, once made.
    mounts: HashMap<Base, OwnedFd>,
    /// The first empty read-only tmpfs that masks a directory: the others
    /// are clones of it (one superblock for all).
    empty: Option<OwnedFd>,
    /// The writable, detached clones of the guarded binds, with where
    /// they go (see [`Step::Guarded`]).
    guarded: Vec<(PathBuf, OwnedFd)>,
    /// The writable layer's dir that holds the overlay's upper and work
    /// dirs and the [`Step::LayerDir`]s.
    layer: Option<OwnedFd>,
    /// The overlay's upper dir, for a sandbox whose layer is kept
    /// ([`SandboxSpec::keep_layer`]).
    pub upper: Option<OwnedFd>,
}

impl NewRoot {
    /// The writable clones of the guarded binds, detached, each with the
    /// path in the sandbox where the guarded mount namespace shows it.
    pub fn take_guarded(&mut self) -> Vec<(PathBuf, OwnedFd)> {
        std::mem::take(&mut self.guarded)
    }

    fn base(&self, b: Base) -> Option<BorrowedFd<'_>> {
        match b {
            Base::Root => Some(self.fd.as_fd()),
            other => self.mounts.get(&other).map(AsFd::as_fd),
        }
    }

    /// Resolves `at` to an `O_PATH` fd, creating what its lookup allows;
    /// `None` when an `IfPresent` path (or its mount) is absent. `source`
    /// is the kind of a bind's source, for `Create::LikeSource`.
    fn resolve(&self, at: &At, source: Option<Create>) -> Result<Option<OwnedFd>> {
        let Some(base) = self.base(at.base) else {
            return match at.lookup {
                Lookup::IfPresent => Ok(None),
                _ => Err(Error::Setup(format!(
                    "{}: the mount it lies in was not made",
                    at.shown()
                ))),
            };
        };
        match at.lookup {
            Lookup::Image(create) => {
                let kind = match (create, source) {
                    (Create::LikeSource, Some(k)) => k,
                    (Create::LikeSource, None) => Create::Dir,
                    (k, _) => k,
                };
                ensure_in_root(base, &at.path, kind, 0).map(Some)
            }
            Lookup::RealDir => real_dir(base, at).map(Some),
            Lookup::IfPresent => match beneath::open_beneath(base, &at.path, OFlags::PATH) {
                Ok(fd) => Ok(Some(fd)),
                Err(Errno::NOENT) => Ok(None),
                Err(e) => Err(sys_err(format!("opening {}", at.shown()))(e)),
            },
            Lookup::New(create) => {
                let (parent, name) = split_beneath(base, at)?;
                match create {
                    Create::Dir | Create::LikeSource => {
                        rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755))
                    }
                    Create::File => rustix::fs::openat(
                        &parent,
                        name,
                        OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::WRONLY
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o644),
                    )
                    .map(drop),
                }
                .map_err(sys_err(format!("creating {}", at.shown())))?;
                beneath::open_beneath(&parent, Path::new(name), OFlags::PATH)
                    .map(Some)
                    .map_err(sys_err(format!("opening {}", at.shown())))
            }
        }
    }
}

/// The directory a step's entry is made in: the base itself for a name
/// right beneath it, else one opened beneath it.
enum Parent<'a> {
    Base(BorrowedFd<'a>),
    Opened(OwnedFd),
}

impl AsFd for Parent<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Parent::Base(b) => *b,
            Parent::Opened(o) => o.as_fd(),
        }
    }
}

/// The parent (strictly beneath `base`) and the last name of `at`.
fn split_beneath<'a, 'b>(
    base: BorrowedFd<'b>,
    at: &'a At,
) -> Result<(Parent<'b>, &'a std::ffi::OsStr)> {
    let name = at
        .path
        .file_name()
        .ok_or_else(|| Error::Setup(format!("{}: not a creatable name", at.shown())))?;
    let parent = at.path.parent().unwrap_or(Path::new(""));
    if parent.as_os_str().is_empty() {
        return Ok((Parent::Base(base), name));
    }
    let fd = beneath::open_beneath(base, parent, OFlags::PATH | OFlags::DIRECTORY)
        .map_err(sys_err(format!("opening the parent of {}", at.shown())))?;
    Ok((Parent::Opened(fd), name))
}

/// The image's own directory at `at` (no symlink on the way), made when
/// missing; a symlink or a non-directory fails the start, naming it.
fn real_dir(base: BorrowedFd<'_>, at: &At) -> Result<OwnedFd> {
    match beneath::open_beneath(base, &at.path, OFlags::PATH | OFlags::DIRECTORY) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(Errno::LOOP | Errno::NOTDIR | Errno::XDEV) => return Err(refuse(base, at)),
        Err(e) => return Err(sys_err(format!("opening {}", at.shown()))(e)),
    }
    let (parent, name) = split_beneath(base, at).map_err(|_| refuse(base, at))?;
    match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(sys_err(format!("creating {}", at.shown()))(e)),
    }
    beneath::open_beneath(&parent, Path::new(name), OFlags::PATH | OFlags::DIRECTORY).map_err(|e| {
        match e {
            Errno::LOOP | Errno::NOTDIR => refuse(base, at),
            e => sys_err(format!("opening {}", at.shown()))(e),
        }
    })
}

/// Why the image's `at` cannot be used: the first part of its path that is
/// a symlink or not a directory.
fn refuse(base: BorrowedFd<'_>, at: &At) -> Error {
    let mut dir = rustix::io::fcntl_dupfd_cloexec(base, 3).ok();
    let mut shown = PathBuf::from("/");
    let mut what = "is not a directory".to_string();
    for part in at.path.iter() {
        shown.push(part);
        let Some(d) = &dir else { break };
        match rustix::fs::statat(d, part, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                let target = rustix::fs::readlinkat(d, part, Vec::new())
                    .map(|t| String::from_utf8_lossy(t.as_bytes()).into_owned())
                    .unwrap_or_else(|_| "?".into());
                what = format!("is a symbolic link (to {target})");
                break;
            }
            Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {
                what = "is not a directory".into();
                break;
            }
            Ok(_) => {
                dir =
                    beneath::open_beneath(d, Path::new(part), OFlags::PATH | OFlags::DIRECTORY).ok()
            }
            Err(_) => break,
        }
    }
    let mount = match at.path.iter().next() {
        Some(first) => format!("/{}", first.to_string_lossy()),
        None => "/".into(),
    };
    Error::Setup(format!(
        "the image's {} {what}: sifbox mounts its own {mount} there and does not follow a path the image chose; rebuild the image with {} as an empty directory (for a root file system directory ROOT: rm ROOT{0} && mkdir ROOT{0})",
        shown.display(),
        at.shown(),
    ))
}

/// Opens (creating what is missing) `rel` beneath `root`, resolving every
/// symlink as if `root` were `/` (so an image's symlinks never lead out);
/// a dangling symlink is followed by creating its target. Returns an
/// `O_PATH` fd.
fn ensure_in_root(root: BorrowedFd<'_>, rel: &Path, kind: Create, links: u32) -> Result<OwnedFd> {
    const MAX_LINKS: u32 = 40;
    let shown = || Path::new("/").join(rel).display().to_string();
    if links > MAX_LINKS {
        return Err(Error::Setup(format!(
            "creating {} in the sandbox: too many levels of symbolic links",
            shown()
        )));
    }
    let open = |p: &Path| {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        beneath::open_in_root(root, p, OFlags::PATH)
    };
    match open(rel) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(sys_err(format!("opening {} in the sandbox", shown()))(e)),
    }
    let name = rel
        .file_name()
        .ok_or_else(|| Error::Setup(format!("cannot create {} in the sandbox", shown())))?;
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let parent = if parent_rel.as_os_str().is_empty() {
        open(Path::new("")).map_err(sys_err("opening the sandbox root"))?
    } else {
        ensure_in_root(root, parent_rel, Create::Dir, links)?
    };
    // The parent was resolved inside the root; the new entry is created in
    // it by name, so nothing here follows a symlink.
    let made = match kind {
        Create::Dir | Create::LikeSource => {
            rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755))
        }
        Create::File => rustix::fs::openat(
            &parent,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map(drop),
    };
    match made {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            // A dangling symlink: create its target, resolved inside the
            // root like any other path.
            if let Ok(target) = rustix::fs::readlinkat(&parent, name, Vec::new()) {
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                let next = relative(&Path::new("/").join(parent_rel).join(target));
                return ensure_in_root(root, &next, kind, links + 1);
            }
        }
        Err(e) => return Err(sys_err(format!("creating {} in the sandbox", shown()))(e)),
    }
    open(rel).map_err(sys_err(format!("opening {} in the sandbox", shown())))
}

/// Bytes of a tmpfs's size per inode it may have.
pub const TMPFS_BYTES_PER_INODE: u64 = 4096;

/// The inodes a tmpfs of `size` bytes may have: one per 4 KiB (at least
/// 64). An inode and its dentry are kernel memory (about 1 KiB) that
/// neither the size nor, without a cgroup, the memory limit counts: the
/// kernel's default (half the host's RAM pages) let 600,000 empty files
/// in a 64 MiB /dev/shm take 600 MiB. So empty files take at most a
/// quarter of the size again, and a tmpfs filled with 4 KiB files (a page
/// each) runs out of space and of inodes together.
pub fn tmpfs_inodes(size: u64) -> u64 {
    (size / TMPFS_BYTES_PER_INODE).max(64)
}

/// A fresh file system, configured and mounted detached; its log (the
/// kernel's reasons) goes into the error.
fn make_fs(fs: &Fs, attrs: Attrs, what: &str) -> Result<OwnedFd> {
    let (name, options): (&str, Vec<(&str, String)>) = match fs {
        Fs::Tmpfs { mode, size } => (
            "tmpfs",
            vec![
                ("mode", format!("{mode:o}")),
                ("size", size.to_string()),
                ("nr_inodes", tmpfs_inodes(*size).to_string()),
            ],
        ),
        Fs::Proc => ("proc", Vec::new()),
        Fs::Devpts => (
            "devpts",
            vec![("ptmxmode", "0666".into()), ("mode", "0620".into())],
        ),
    };
    let ctx = fsopen(name, FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(sys_err(format!("{what}: fsopen({name})")))?;
    // The source mountinfo shows (the file system's name, as mount(8)
    // would write it).
    let _ = fsconfig_set_string(&ctx, "source", name);
    for (k, v) in &options {
        fsconfig_set_string(&ctx, *k, v.as_str())
            .map_err(|e| fs_error(&ctx, format!("{what}: {k}={v}"), e))?;
    }
    if *fs == Fs::Devpts {
        // Harmless where every devpts is a new instance (Linux >= 4.7).
        let _ = fsconfig_set_flag(&ctx, "newinstance");
    }
    fsconfig_create(&ctx).map_err(|e| fs_error(&ctx, format!("{what}: creating {name}"), e))?;
    fsmount(&ctx, FsMountFlags::FSMOUNT_CLOEXEC, attrs.flags())
        .map_err(|e| fs_error(&ctx, format!("{what}: fsmount({name})"), e))
}

/// An fsconfig/fsmount failure, with the messages the kernel logged on the
/// file system context.
fn fs_error(ctx: &OwnedFd, what: String, e: Errno) -> Error {
    let mut log = Vec::new();
    let mut buf = [0u8; 256];
    while let Ok(n) = rustix::io::read(ctx, &mut buf) {
        if n == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf[..n]);
        log.push(line.trim_start_matches("e ").trim().to_string());
    }
    let detail = if log.is_empty() {
        String::new()
    } else {
        format!(" ({})", log.join("; "))
    };
    Error::syscall(format!("{what}{detail}"), e)
}

fn attach(tree: &OwnedFd, target: BorrowedFd<'_>, what: &str) -> Result<()> {
    move_mount(
        tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(sys_err(format!("{what}: attaching the mount")))
}

/// A detached clone of the mount tree at `src` (a host path), recursive.
fn clone_host(src: &Path, what: &str) -> std::result::Result<OwnedFd, (Errno, Error)> {
    open_tree(
        CWD,
        src,
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(|e| {
        (
            e,
            sys_err(format!("{what}: cloning the mount at {}", src.display()))(e),
        )
    })
}

fn readonly(tree: &OwnedFd, what: &str) -> Result<()> {
    sifbox_sys::make_readonly_fd(tree.as_fd())
        .map_err(|e| Error::Setup(format!("{what}: making it read-only: {e}")))
}

/// Mounts the view of its own cgroup a sandbox has at `target` (see
/// [`Step::CgroupView`]). The host's /sys/fs/cgroup lists every cgroup,
/// other sandboxes' among them: the tmpfs covers it (a cover that the
/// sandbox, holding no capability over this mount namespace, cannot
/// remove). A cgroup v2 view is bound at `target` itself.
fn cgroup_view(target: BorrowedFd<'_>, views: &[(String, PathBuf)]) -> Result<()> {
    let what = "mounting the sandbox's /sys/fs/cgroup";
    if let [(name, dir)] = views {
        if name.is_empty() {
            let t = clone_host(dir, what).map_err(|(_, e)| e)?;
            readonly(&t, what)?;
            return attach(&t, target, what);
        }
    }
    let top = make_fs(
        &Fs::Tmpfs {
            mode: 0o755,
            size: 64 << 10,
        },
        Attrs::NOSUID_NODEV_NOEXEC,
        what,
    )?;
    attach(&top, target, what)?;
    for (name, dir) in views {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            continue;
        }
        rustix::fs::mkdirat(&top, name.as_str(), Mode::from_raw_mode(0o555))
            .map_err(sys_err(format!("{what}: creating {name}")))?;
        let sub = beneath::open_beneath(&top, Path::new(name), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(sys_err(format!("{what}: opening {name}")))?;
        let t = clone_host(dir, what).map_err(|(_, e)| e)?;
        attach(&t, sub.as_fd(), what)?;
        // `cpu,cpuacct` is also found as `cpu` and `cpuacct`, as on hosts.
        if name.contains(',') {
            for c in name.split(',') {
                if !c.is_empty() && !views.iter().any(|(n, _)| n == c) {
                    let _ = rustix::fs::symlinkat(name.as_str(), &top, c);
                }
            }
        }
    }
    readonly(&top, what)
}

/// Carries out `steps` on `root`.
pub fn apply(root: &mut NewRoot, steps: &[Step]) -> Result<()> {
    for step in steps {
        apply_one(root, step)?;
    }
    Ok(())
}

fn apply_one(root: &mut NewRoot, step: &Step) -> Result<()> {
    match step {
        Step::Mount {
            fs,
            at,
            attrs,
            names,
        } => {
            let what = format!("mounting {}", at.shown());
            let Some(target) = root.resolve(at, None)? else {
                return Ok(());
            };
            let mnt = make_fs(fs, *attrs, &what)?;
            attach(&mnt, target.as_fd(), &what)?;
            if let Some(b) = names {
                root.mounts.insert(*b, mnt);
            }
        }
        Step::Sys { at, own_netns } => {
            let Some(target) = root.resolve(at, None)? else {
                return Ok(());
            };
            let fresh = own_netns.then(|| {
                let ctx = fsopen("sysfs", FsOpenFlags::FSOPEN_CLOEXEC).ok()?;
                let _ = fsconfig_set_string(&ctx, "source", "sysfs");
                fsconfig_create(&ctx).ok()?;
                let attrs = Attrs {
                    readonly: true,
                    ..Attrs::NOSUID_NODEV_NOEXEC
                };
                fsmount(&ctx, FsMountFlags::FSMOUNT_CLOEXEC, attrs.flags()).ok()
            });
            let tree = match fresh.flatten() {
                Some(t) => Some(t),
                None => clone_host(Path::new("/sys"), "/sys")
                    .ok()
                    .filter(|t| readonly(t, "/sys").is_ok()),
            };
            match tree {
                Some(t) => match attach(&t, target.as_fd(), "/sys") {
                    Ok(()) => {
                        root.mounts.insert(Base::Sys, t);
                    }
                    Err(e) => tracing::debug!("leaving /sys empty: {e}"),
                },
                None => tracing::debug!("leaving /sys empty: the kernel allows no sysfs here"),
            }
        }
        Step::BindHost {
            src,
            at,
            readonly: ro,
            need,
        } => {
            let what = format!("binding {} at {}", src.display(), at.shown());
            let made = bind_host(root, src, at, *ro, &what);
            match (made, need) {
                (Ok(()), _) => {}
                (Err((Errno::NOENT, _)), Need::IfOnHost) => {}
                (Err((_, e)), Need::BestEffort) => tracing::debug!("not {what}: {e}"),
                (Err((_, e)), _) => return Err(e),
            }
        }
        Step::Guarded { src, at, dst } => {
            let what = format!("binding {} at {} (guarded)", src.display(), at.shown());
            let (tree, kind) = clone_dir(src, &what)?;
            let (writable, _) = clone_dir(src, &what)?;
            let target = root
                .resolve(at, Some(kind))?
                .ok_or_else(|| Error::Setup(format!("{what}: nowhere to attach it")))?;
            readonly(&tree, &what)?;
            attach(&tree, target.as_fd(), &what)?;
            root.guarded.push((dst.clone(), writable));
        }
        Step::File { at, contents } => {
            let Some(target) = root.resolve(at, None)? else {
                return Ok(());
            };
            let what = format!("writing {}", at.shown());
            let fs = make_fs(
                &Fs::Tmpfs {
                    mode: 0o755,
                    size: FILE_TMPFS_BYTES,
                },
                Attrs::NOSUID_NODEV_NOEXEC,
                &what,
            )?;
            let file = rustix::fs::openat(
                &fs,
                "file",
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map_err(sys_err(&what))?;
            std::fs::File::from(file)
                .write_all(contents)
                .map_err(|e| Error::Setup(format!("{what}: {e}")))?;
            let tree = open_tree(
                &fs,
                "file",
                OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )
            .map_err(sys_err(format!("{what}: cloning it")))?;
            attach(&tree, target.as_fd(), &what)?;
        }
        Step::CgroupView { at, views } => {
            let Some(target) = root.resolve(at, None)? else {
                return Ok(());
            };
            cgroup_view(target.as_fd(), views)?;
        }
        Step::ReadOnly { at } => {
            let Some(target) = root.resolve(at, None)? else {
                return Ok(());
            };
            let what = format!("covering {} read-only", at.shown());
            let tree = open_tree(
                &target,
                "",
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_EMPTY_PATH
                    | OpenTreeFlags::AT_RECURSIVE,
            )
            .map_err(sys_err(format!("{what}: cloning it")))?;
            readonly(&tree, &what)?;
            attach(&tree, target.as_fd(), &what)?;
        }
        Step::Mask { at } => {
            let Some(target) = root.resolve(at, None)? else {
                return Ok(());
            };
            let what = format!("masking {}", at.shown());
            let st = rustix::fs::fstat(&target).map_err(sys_err(&what))?;
            let tree = if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                match &root.empty {
                    Some(empty) => open_tree(
                        empty,
                        "",
                        OpenTreeFlags::OPEN_TREE_CLONE
                            | OpenTreeFlags::OPEN_TREE_CLOEXEC
                            | OpenTreeFlags::AT_EMPTY_PATH,
                    )
                    .map_err(sys_err(format!("{what}: cloning the empty mount")))?,
                    None => make_fs(
                        &Fs::Tmpfs {
                            mode: 0o555,
                            size: 4096,
                        },
                        Attrs {
                            readonly: true,
                            ..Attrs::NOSUID_NODEV_NOEXEC
                        },
                        &what,
                    )?,
                }
            } else {
                let t = clone_host(Path::new("/dev/null"), &what).map_err(|(_, e)| e)?;
                readonly(&t, &what)?;
                t
            };
            attach(&tree, target.as_fd(), &what)?;
            if root.empty.is_none() && FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                root.empty = Some(tree);
            }
        }
        Step::MakeDir { at, mode } => {
            let Some(base) = root.base(at.base) else {
                return Ok(());
            };
            let exists = beneath::open_in_root(base, &at.path, OFlags::PATH);
            if exists.is_ok() {
                return Ok(());
            }
            root.resolve(at, None)?;
            // Reopened for fchmod (an O_PATH fd cannot change modes); the
            // umask must not decide a world-writable /tmp.
            let dir = beneath::open_in_root(base, &at.path, OFlags::RDONLY | OFlags::DIRECTORY)
                .map_err(sys_err(format!("opening {}", at.shown())))?;
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(*mode))
                .map_err(sys_err(format!("chmod {}", at.shown())))?;
        }
        Step::Symlink { at, target } => {
            let Some(base) = root.base(at.base) else {
                return Ok(());
            };
            let (parent, name) = split_beneath(base, at)?;
            rustix::fs::symlinkat(target.as_path(), &parent, name)
                .map_err(sys_err(format!("creating {}", at.shown())))?;
        }
        Step::LayerDir { name, at } => {
            let what = format!("the writable layer's dir at {}", at.shown());
            let Some(layer) = root.layer.as_ref() else {
                return Err(Error::Setup(format!("{what}: no writable layer")));
            };
            let tree = open_tree(
                layer,
                name.as_str(),
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(sys_err(format!("{what}: cloning it")))?;
            let Some(target) = root.resolve(at, Some(Create::Dir))? else {
                return Err(Error::Setup(format!("{what}: nowhere to attach it")));
            };
            attach(&tree, target.as_fd(), &what)?;
        }
    }
    Ok(())
}

fn bind_host(
    root: &NewRoot,
    src: &Path,
    at: &At,
    ro: bool,
    what: &str,
) -> std::result::Result<(), (Errno, Error)> {
    let tree = clone_host(src, what)?;
    let st = rustix::fs::fstat(&tree).map_err(|e| (e, sys_err(what)(e)))?;
    let kind = if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        Create::Dir
    } else {
        Create::File
    };
    let target = root
        .resolve(at, Some(kind))
        .map_err(|e| (Errno::INVAL, e))?
        .ok_or_else(|| {
            (
                Errno::NOENT,
                Error::Setup(format!("{what}: nowhere to attach it")),
            )
        })?;
    if ro {
        readonly(&tree, what).map_err(|e| (Errno::INVAL, e))?;
    }
    attach(&tree, target.as_fd(), what).map_err(|e| (Errno::INVAL, e))
}

/// A detached clone of the host directory `src` (a guarded bind's),
/// checked to be a directory.
fn clone_dir(src: &Path, what: &str) -> Result<(OwnedFd, Create)> {
    let tree = clone_host(src, what).map_err(|(_, e)| e)?;
    let st = rustix::fs::fstat(&tree).map_err(sys_err(what))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(Error::Setup(format!(
            "{what}: {} is not a directory",
            src.display()
        )));
    }
    Ok((tree, Create::Dir))
}

/// Escapes a path for an overlayfs option value (`,` `:` `\` are special).
fn overlay_escape(p: &Path) -> String {
    let mut out = String::new();
    for ch in p.to_string_lossy().chars() {
        if matches!(ch, ',' | ':' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn open_dir(p: &Path, nofollow: bool) -> Result<OwnedFd> {
    let mut flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if nofollow {
        flags |= OFlags::NOFOLLOW;
    }
    rustix::fs::open(p, flags, Mode::empty()).map_err(sys_err(format!("opening {}", p.display())))
}

/// Makes the private mount namespace's writable layer at `m/` in the
/// runtime dir `dir` (a tmpfs; `disk`, the detached ext4 mount outer made
/// for [`Writable::Disk`]; or a small tmpfs beside `--overlay DIR`) and the
/// overlay root over the image's layers; returns the root, ready for
/// [`apply`].
pub fn prepare_root(spec: &SandboxSpec, dir: &Path, disk: Option<OwnedFd>) -> Result<NewRoot> {
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(sys_err("making the mount namespace private"))?;
    let tmpfs_bytes = match &spec.writable {
        Writable::Tmpfs { size_mib } => size_mib.saturating_mul(1 << 20),
        Writable::Overlay { .. } | Writable::Disk { .. } => 1 << 20,
    };
    let m_target = open_dir(&dir.join("m"), true)?;
    let m = match (&spec.writable, disk) {
        (Writable::Disk { .. }, Some(disk)) => disk,
        (Writable::Disk { .. }, None) => {
            return Err(Error::Setup(
                "the disk-backed writable layer was not made".into(),
            ))
        }
        _ => make_fs(
            &Fs::Tmpfs {
                mode: 0o755,
                size: tmpfs_bytes,
            },
            Attrs {
                nosuid: true,
                nodev: true,
                ..Attrs::default()
            },
            "the writable layer",
        )?,
    };
    attach(&m, m_target.as_fd(), "the writable layer")?;
    // On ext4 each directory of the root starts in a block group of its
    // own (the Orlov allocator spreads them), and the first allocation in
    // a group sets up its bitmaps (0.27 ms each at a start): the three go
    // under one directory there, in its group.
    let m = if matches!(spec.writable, Writable::Disk { .. }) {
        rustix::fs::mkdirat(&m, "l", Mode::from_raw_mode(0o755))
            .map_err(sys_err("creating m/l"))?;
        beneath::open_beneath(&m, Path::new("l"), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(sys_err("opening m/l"))?
    } else {
        m
    };
    let mkdir = |name: &str| {
        rustix::fs::mkdirat(&m, name, Mode::from_raw_mode(0o755))
            .map_err(sys_err(format!("creating m/{name}")))
    };
    mkdir("root")?;
    for i in 0..spec.layer_dirs.len() {
        mkdir(&layer_dir_name(i))?;
    }
    let (upper, work) = match &spec.writable {
        Writable::Tmpfs { .. } | Writable::Disk { .. } => {
            mkdir("upper")?;
            mkdir("work")?;
            (
                beneath::open_beneath(&m, Path::new("upper"), OFlags::PATH | OFlags::DIRECTORY)
                    .map_err(sys_err("opening m/upper"))?,
                beneath::open_beneath(&m, Path::new("work"), OFlags::PATH | OFlags::DIRECTORY)
                    .map_err(sys_err("opening m/work"))?,
            )
        }
        Writable::Overlay { dir } => {
            let d = open_dir(dir, false)?;
            let sub = |n: &str| {
                beneath::open_beneath(&d, Path::new(n), OFlags::PATH | OFlags::DIRECTORY)
                    .map_err(sys_err(format!("opening {}/{n}", dir.display())))
            };
            (sub("upper")?, sub("work")?)
        }
    };
    // Every layer by fd: the option string names only /proc/self/fd/N, so
    // the sandbox's mountinfo shows no host path.
    let mut lowers = Vec::new();
    for l in spec.layers.iter().chain(std::iter::once(&spec.rootfs)) {
        lowers.push(open_dir(l, false)?);
    }
    if let Some(tree) = lowers.last() {
        remake_modes(tree, &upper);
    }
    let lower = lowers
        .iter()
        .map(|fd| overlay_escape(&fd_path(fd)))
        .collect::<Vec<_>>()
        .join(":");
    let root_target =
        beneath::open_beneath(&m, Path::new("root"), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(sys_err("opening m/root"))?;
    // The new mount API first, one layer per `lowerdir+` (Linux 6.8: no
    // limit on the number of layers, where an fsconfig string holds 256
    // bytes); else mount(2), whose options hold a page (some 200 layers
    // named by fd).
    let upper_s = overlay_escape(&fd_path(&upper));
    let work_s = overlay_escape(&fd_path(&work));
    let new_api = |userxattr: bool| -> std::result::Result<(), Error> {
        let ctx =
            fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC).map_err(sys_err("fsopen(overlay)"))?;
        let _ = fsconfig_set_string(&ctx, "source", "sifbox-overlay");
        let set = |k: &str, v: &str| {
            fsconfig_set_string(&ctx, k, v).map_err(|e| fs_error(&ctx, format!("overlay {k}"), e))
        };
        for fd in &lowers {
            set("lowerdir+", &overlay_escape(&fd_path(fd)))?;
        }
        set("upperdir", &upper_s)?;
        set("workdir", &work_s)?;
        if userxattr {
            // We are always in a user namespace here, where overlayfs
            // cannot use trusted.* xattrs: ask for user.* ones.
            fsconfig_set_flag(&ctx, "userxattr")
                .map_err(|e| fs_error(&ctx, "overlay userxattr".into(), e))?;
        }
        fsconfig_create(&ctx).map_err(|e| fs_error(&ctx, "creating the overlay".into(), e))?;
        let ovl = fsmount(&ctx, FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())
            .map_err(|e| fs_error(&ctx, "fsmount(overlay)".into(), e))?;
        attach(&ovl, root_target.as_fd(), "the overlay root")
    };
    let legacy = |userxattr: bool| -> std::result::Result<(), Error> {
        let mut opts = format!("lowerdir={lower},upperdir={upper_s},workdir={work_s}");
        if userxattr {
            opts.push_str(",userxattr");
        }
        let data = std::ffi::CString::new(opts)
            .map_err(|_| Error::Setup("a NUL in the overlay options".into()))?;
        rustix::mount::mount(
            "sifbox-overlay",
            fd_path(&root_target).as_path(),
            "overlay",
            rustix::mount::MountFlags::empty(),
            Some(data.as_c_str()),
        )
        .map_err(sys_err("mount(overlay)"))
    };
    new_api(true)
        .or_else(|e| {
            tracing::debug!("the mount API's overlay failed ({e}); using mount(2)");
            legacy(true)
        })
        .or_else(|_| legacy(false))
        .map_err(|e| {
            Error::Setup(format!(
                "mounting the overlay root (image {}): {e}; run `sifbox doctor` to see whether overlayfs works in a user namespace here",
                spec.rootfs.display()
            ))
        })?;
    // The overlay is what m/root shows now.
    let fd = beneath::open_beneath(&m, Path::new("root"), OFlags::PATH | OFlags::DIRECTORY)
        .map_err(sys_err("opening the overlay root"))?;
    Ok(NewRoot {
        fd,
        mounts: HashMap::new(),
        empty: None,
        guarded: Vec::new(),
        layer: Some(m),
        upper: spec.keep_layer.is_some().then_some(upper),
    })
}

/// The record a shared store's tree has at its root of the modes that were
/// closed to group and world writes there (`sifbox_image::setid::
/// MODES_RECORD`: JSON `[[path, mode, is_dir], ...]`).
const MODES_RECORD: &str = ".sifbox-modes";

/// Re-makes, in the sandbox's own upper layer `upper`, the directories the
/// tree `lower` records in [`MODES_RECORD`] with the modes the image gave
/// them: a merged directory takes its mode from the upper one, so `/tmp`
/// is 1777 inside while the shared tree's is not writable by the group.
/// Parents made on the way get the tree's modes. Best effort: a record that
/// is missing, too big or malformed, or an entry that cannot be made, is
/// left (the directory then stays as the tree has it).
fn remake_modes(lower: &OwnedFd, upper: &OwnedFd) {
    use std::io::Read as _;
    let Ok(fd) = beneath::open_beneath(
        lower,
        MODES_RECORD,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
    ) else {
        return;
    };
    let mut text = Vec::new();
    if std::fs::File::from(fd)
        .take((1 << 20) + 1)
        .read_to_end(&mut text)
        .is_err()
        || text.len() > 1 << 20
    {
        return;
    }
    let Ok(record) = serde_json::from_slice::<Vec<(String, u32, bool)>>(&text) else {
        return;
    };
    for (path, mode, dir) in record {
        if !dir || path.is_empty() {
            continue;
        }
        let parts: Vec<&std::ffi::OsStr> = match Path::new(&path)
            .components()
            .map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            Some(p) if !p.is_empty() => p,
            _ => continue,
        };
        let mut made = PathBuf::new();
        let mut cur: Option<OwnedFd> = None;
        for (i, name) in parts.iter().enumerate() {
            made.push(name);
            let last = i + 1 == parts.len();
            let parent = cur.as_ref().map_or(upper.as_fd(), AsFd::as_fd);
            let fresh = match rustix::fs::mkdirat(parent, *name, Mode::from_raw_mode(0o700)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(_) => break,
            };
            let Ok(next) = rustix::fs::openat(
                parent,
                *name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                break;
            };
            let want = if last {
                Some(mode & 0o7777)
            } else if fresh {
                // The tree's own mode for a parent made on the way.
                beneath::open_beneath(lower, &made, OFlags::PATH)
                    .and_then(|p| rustix::fs::fstat(&p))
                    .ok()
                    .map(|st| st.st_mode & 0o7777)
            } else {
                None
            };
            if let Some(m) = want {
                let _ = rustix::fs::fchmod(&next, Mode::from_raw_mode(m));
            }
            cur = Some(next);
        }
    }
}

/// Prepares the overlay root and carries out the plan of `spec` on it;
/// `cgroup_views` is what its /sys/fs/cgroup shows ([`Step::CgroupView`]).
pub fn assemble(
    spec: &SandboxSpec,
    dir: &Path,
    disk: Option<OwnedFd>,
    cgroup_views: Vec<(String, PathBuf)>,
) -> Result<NewRoot> {
    let mut root = prepare_root(spec, dir, disk)?;
    apply(&mut root, &plan_with_cgroup(spec, cgroup_views))?;
    Ok(root)
}

/// Mounts each writable clone of a guarded bind in `trees` (from
/// [`NewRoot::take_guarded`]) over its read-only bind at its path, in the
/// guarded mount namespace that the calling process has just made (after
/// the pivot: the path is the sandbox's, looked up as the image left it,
/// as the bind's was; nothing inside has run yet).
pub fn attach_guarded(trees: &[(PathBuf, OwnedFd)]) -> Result<()> {
    for (dst, tree) in trees {
        let what = format!("mounting {} writable for guarded requests", dst.display());
        let target = rustix::fs::open(
            dst,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(sys_err(format!("{what}: opening it")))?;
        attach(tree, target.as_fd(), &what)?;
    }
    Ok(())
}

/// [`plan`] with the sandbox's /sys/fs/cgroup ([`Step::CgroupView`])
/// right after /sys.
pub fn plan_with_cgroup(spec: &SandboxSpec, views: Vec<(String, PathBuf)>) -> Vec<Step> {
    let mut steps = plan(spec);
    let at = steps
        .iter()
        .position(|s| matches!(s, Step::Sys { .. }))
        .map_or(steps.len(), |i| i + 1);
    steps.insert(
        at,
        Step::CgroupView {
            at: At::new(Base::Sys, "fs/cgroup", Lookup::IfPresent),
            views,
        },
    );
    steps
}

/// Makes `root` the root of this mount namespace and detaches the old one.
pub fn pivot(root: &NewRoot) -> Result<()> {
    rustix::process::fchdir(&root.fd).map_err(sys_err("changing to the new root"))?;
    rustix::process::pivot_root(".", ".").map_err(sys_err("pivot_root"))?;
    unmount(".", UnmountFlags::DETACH).map_err(sys_err("detaching the old root"))?;
    rustix::process::chdir("/").map_err(sys_err("chdir /"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Bind, Confinement, IdMapping, UsernsMode};

    fn spec() -> SandboxSpec {
        SandboxSpec {
            name: "t".into(),
            rootfs: "/images/x".into(),
            layers: Vec::new(),
            hostname: "t".into(),
            net: NetMode::Host,
            ids: IdMapping {
                mode: UsernsMode::Single,
                uid: Vec::new(),
                gid: Vec::new(),
                external: false,
            },
            writable: Writable::Tmpfs { size_mib: 16 },
            binds: vec![Bind {
                src: "/data".into(),
                dst: "/mnt/../data".into(),
                readonly: true,
            }],
            guarded: Vec::new(),
            layer_dirs: Vec::new(),
            tmpfs: Vec::new(),
            keep_layer: None,
            host_dns: true,
            shm_bytes: 1 << 20,
            confinement: Confinement::default(),
            limits: crate::spec::Limits::default(),
        }
    }

    #[test]
    fn escapes_overlay_specials() {
        assert_eq!(overlay_escape(Path::new("/a,b:c\\d")), "/a\\,b\\:c\\\\d");
        assert_eq!(overlay_escape(Path::new("/plain/path")), "/plain/path");
    }

    #[test]
    fn relative_drops_root() {
        assert_eq!(relative(Path::new("/a/./b/")), PathBuf::from("a/b"));
        assert_eq!(relative(Path::new("/")), PathBuf::new());
    }

    /// The writable layer's dirs are bound last, over the binds (eval's
    /// /logs/agent over the rollout dir's /logs), each its own.
    #[test]
    fn layer_dirs_come_after_the_binds() {
        let mut s = spec();
        s.layer_dirs = vec!["/logs/agent".into(), "/logs/artifacts".into()];
        let steps = plan(&s);
        let last_bind = steps
            .iter()
            .rposition(|st| matches!(st, Step::BindHost { .. }))
            .expect("a bind");
        let dirs: Vec<(usize, String, String)> = steps
            .iter()
            .enumerate()
            .filter_map(|(i, st)| match st {
                Step::LayerDir { name, at } => Some((i, name.clone(), at.shown())),
                _ => None,
            })
            .collect();
        assert_eq!(dirs.len(), 2, "{steps:?}");
        assert!(dirs.iter().all(|(i, _, _)| *i > last_bind));
        assert_eq!(
            (dirs[0].1.as_str(), dirs[0].2.as_str()),
            ("d0", "/logs/agent")
        );
        assert_eq!(
            (dirs[1].1.as_str(), dirs[1].2.as_str()),
            ("d1", "/logs/artifacts")
        );
    }

    #[test]
    fn the_plan_covers_and_masks_what_it_must() {
        let steps = plan(&spec());
        let covered: Vec<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::ReadOnly { at } => Some(at.shown()),
                _ => None,
            })
            .collect();
        for p in [
            "/proc/sys",
            "/proc/sysrq-trigger",
            "/proc/irq",
            "/proc/bus",
            "/proc/fs",
        ] {
            assert!(
                covered.contains(&p.to_string()),
                "{p} not read-only: {covered:?}"
            );
        }
        let masked: Vec<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Mask { at } => Some(at.shown()),
                _ => None,
            })
            .collect();
        for p in [
            "/proc/kcore",
            "/proc/keys",
            "/proc/timer_list",
            "/sys/firmware",
        ] {
            assert!(
                masked.contains(&p.to_string()),
                "{p} not masked: {masked:?}"
            );
        }
        // Covers and masks only ever look inside sifbox's own mounts, and
        // follow nothing there.
        for s in &steps {
            if let Step::ReadOnly { at } | Step::Mask { at } = s {
                assert_ne!(at.base, Base::Root, "{s:?}");
                assert_eq!(at.lookup, Lookup::IfPresent, "{s:?}");
            }
        }
    }

    #[test]
    fn proc_dev_and_sys_must_be_real_directories_of_the_image() {
        let steps = plan(&spec());
        for dir in ["proc", "dev", "sys"] {
            let first = steps
                .iter()
                .position(|s| match s {
                    Step::Mount { at, .. } | Step::Sys { at, .. } => {
                        at.base == Base::Root && at.path == Path::new(dir)
                    }
                    _ => false,
                })
                .unwrap_or_else(|| panic!("nothing mounted at /{dir}"));
            match &steps[first] {
                Step::Mount { at, .. } | Step::Sys { at, .. } => {
                    assert_eq!(at.lookup, Lookup::RealDir, "/{dir}");
                }
                _ => unreachable!(),
            }
            // Nothing mounted there through the image's own lookup.
            assert!(!steps.iter().any(|s| matches!(s,
                Step::Mount { at, .. } | Step::BindHost { at, .. }
                    if at.base == Base::Root
                        && at.path.starts_with(dir)
                        && at.lookup != Lookup::RealDir)));
        }
        // The masks and covers of a mount come after the mount.
        let proc_mount = steps
            .iter()
            .position(|s| {
                matches!(
                    s,
                    Step::Mount {
                        names: Some(Base::Proc),
                        ..
                    }
                )
            })
            .expect("proc");
        let first_cover = steps
            .iter()
            .position(|s| matches!(s, Step::ReadOnly { at } if at.base == Base::Proc))
            .expect("cover");
        assert!(proc_mount < first_cover);
    }

    #[test]
    fn a_guarded_bind_comes_after_the_binds_it_may_lie_below() {
        let mut s = spec();
        s.binds.push(Bind {
            src: "/rollout".into(),
            dst: "/logs".into(),
            readonly: false,
        });
        s.guarded.push(crate::spec::GuardedBind {
            src: "/rollout/verifier".into(),
            dst: "/logs/verifier".into(),
        });
        let steps = plan(&s);
        let logs = steps
            .iter()
            .position(|st| matches!(st, Step::BindHost { src, .. } if src == Path::new("/rollout")))
            .expect("the /logs bind");
        let guarded = steps
            .iter()
            .position(|st| {
                matches!(st, Step::Guarded { src, at, dst }
                    if src == Path::new("/rollout/verifier")
                        && at.path == Path::new("logs/verifier")
                        && at.lookup == Lookup::Image(Create::Dir)
                        && dst == Path::new("/logs/verifier"))
            })
            .expect("the guarded bind");
        assert!(logs < guarded);
        // A destination with `..` or a relative one is refused up front.
        for bad in ["/logs/../etc", "logs/verifier", "/"] {
            let mut s = spec();
            s.name = "t".into();
            s.binds.clear();
            s.guarded.push(crate::spec::GuardedBind {
                src: "/rollout/verifier".into(),
                dst: bad.into(),
            });
            let e = s.validate().expect_err(bad).to_string();
            assert!(e.contains("guarded bind"), "{bad}: {e}");
        }
    }

    #[test]
    fn tmpfs_mounts_are_real_tmpfs_of_their_size_after_the_binds() {
        let mut s = spec();
        s.tmpfs.push(crate::spec::TmpfsMount {
            dst: "/scratch/t".into(),
            size: 1 << 20,
            mode: 0o1777,
        });
        let steps = plan(&s);
        let last = steps.last().expect("steps");
        assert_eq!(
            last,
            &Step::Mount {
                fs: Fs::Tmpfs {
                    mode: 0o1777,
                    size: 1 << 20
                },
                at: At {
                    base: Base::Root,
                    path: "scratch/t".into(),
                    lookup: Lookup::Image(Create::Dir),
                },
                attrs: Attrs {
                    nosuid: true,
                    nodev: true,
                    ..Attrs::default()
                },
                names: None,
            }
        );
        s.tmpfs[0].size = 0;
        assert!(s.validate().is_err());
    }

    #[test]
    fn binds_follow_the_spec_and_the_image_cannot_lead_them_out() {
        let steps = plan(&spec());
        let bind = steps
            .iter()
            .find_map(|s| match s {
                Step::BindHost {
                    src,
                    at,
                    readonly,
                    need,
                } if src == Path::new("/data") => Some((at.clone(), *readonly, *need)),
                _ => None,
            })
            .expect("the bind");
        assert_eq!(bind.0.base, Base::Root);
        assert_eq!(bind.0.lookup, Lookup::Image(Create::LikeSource));
        assert!(bind.1, "read-only");
        assert_eq!(bind.2, Need::Required);
        // Host DNS files only with the host's network.
        let dns = |s: &SandboxSpec| {
            plan(s)
                .iter()
                .any(|st| matches!(st, Step::BindHost { src, .. } if src == Path::new("/etc/resolv.conf")))
        };
        assert!(dns(&spec()));
        let mut none = spec();
        none.net = NetMode::None;
        assert!(!dns(&none));
        // /dev/shm has the spec's size; /tmp is no mount of its own.
        assert!(steps.iter().any(|s| matches!(s,
            Step::Mount { fs: Fs::Tmpfs { size, .. }, at, .. }
                if at.base == Base::Dev && at.path == Path::new("shm") && *size == 1 << 20)));
        assert!(!steps.iter().any(|s| matches!(s,
            Step::Mount { at, .. } if at.path == Path::new("tmp"))));
    }

    #[test]
    fn lookups_stay_inside_and_refuse_symlinked_mount_points() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let rootp = dir.path().join("root");
        std::fs::create_dir(&rootp).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), rootp.join("evil")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), rootp.join("proc")).expect("symlink");
        std::fs::write(rootp.join("sys"), b"").expect("file");
        let fd = rustix::fs::open(&rootp, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .expect("open");
        let root = NewRoot {
            fd,
            mounts: HashMap::new(),
            empty: None,
            guarded: Vec::new(),
            layer: None,
            upper: None,
        };
        // Image lookups: the absolute symlink is taken relative to the root.
        root.resolve(
            &At::new(Base::Root, "evil/x/y", Lookup::Image(Create::Dir)),
            None,
        )
        .expect("ensure");
        root.resolve(
            &At::new(Base::Root, "f/file", Lookup::Image(Create::File)),
            None,
        )
        .expect("ensure file");
        assert!(rootp.join("f/file").is_file());
        let inside_target = rootp.join(outside.path().strip_prefix("/").expect("abs"));
        assert!(inside_target.join("x/y").is_dir());
        assert!(!outside.path().join("x").exists());
        // Strict lookups refuse what the image redirected, naming it.
        let e = root
            .resolve(&At::new(Base::Root, "proc", Lookup::RealDir), None)
            .expect_err("symlinked /proc");
        let msg = e.to_string();
        assert!(msg.contains("/proc is a symbolic link"), "{msg}");
        assert!(msg.contains(&outside.path().display().to_string()), "{msg}");
        let e = root
            .resolve(&At::new(Base::Root, "sys", Lookup::RealDir), None)
            .expect_err("/sys a file");
        assert!(e.to_string().contains("/sys is not a directory"), "{e}");
        // A missing one is made, as a directory.
        root.resolve(&At::new(Base::Root, "dev", Lookup::RealDir), None)
            .expect("made");
        assert!(rootp.join("dev").is_dir());
        // IfPresent: absent is nothing to do; a symlink is never followed.
        assert!(root
            .resolve(&At::new(Base::Root, "nothing", Lookup::IfPresent), None)
            .expect("absent")
            .is_none());
        assert!(root
            .resolve(&At::new(Base::Root, "evil/x", Lookup::IfPresent), None)
            .is_err());
        assert!(std::fs::read_dir(outside.path())
            .expect("ls")
            .next()
            .is_none());
    }
}
