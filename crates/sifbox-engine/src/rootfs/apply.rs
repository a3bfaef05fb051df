//! Carrying out the steps of a [`super::plan`] on the root being
//! assembled, every mount through the syscall seam ([`Syscall`]): file
//! systems made detached, binds cloned and made read-only while detached,
//! then attached with `move_mount` onto an fd that a lookup beneath the
//! new root gave.

use std::io::Write as _;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, CWD};
use rustix::io::Errno;
use rustix::mount::{MountAttrFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags};
use sifbox_sys::syscall::{FsParam, Syscall};

use super::error::{sys_err, Result, RootfsError};
use super::lookup::{split_beneath, NewRoot};
use super::{At, Attrs, Base, Create, Fs, Need, Step, FILE_TMPFS_BYTES};
use sifbox_sys::beneath;

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
pub(super) fn make_fs(sys: &dyn Syscall, fs: &Fs, attrs: Attrs, what: &str) -> Result<OwnedFd> {
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
    // The source mountinfo shows (the file system's name, as mount(8)
    // would write it).
    let mut params = vec![FsParam::set("source", name).optional()];
    params.extend(options.iter().map(|(k, v)| FsParam::set(k, v)));
    if *fs == Fs::Devpts {
        // Harmless where every devpts is a new instance (Linux >= 4.7).
        params.push(FsParam::flag("newinstance").optional());
    }
    sys.fs_mount(name, &params, attrs.flags())
        .map_err(|source| RootfsError::Fs {
            step: what.to_string(),
            source,
        })
}

/// Attaches the detached `tree` on `target`.
pub(super) fn attach(
    sys: &dyn Syscall,
    tree: &OwnedFd,
    target: BorrowedFd<'_>,
    what: &str,
) -> Result<()> {
    sys.move_mount(
        tree.as_fd(),
        Path::new(""),
        target,
        Path::new(""),
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(sys_err(format!("{what}: attaching the mount")))
}

/// A detached clone of the mount tree at `src` (a host path), recursive.
fn clone_host(
    sys: &dyn Syscall,
    src: &Path,
    what: &str,
) -> std::result::Result<OwnedFd, (Errno, RootfsError)> {
    sys.open_tree(
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

/// Makes the detached `tree` read-only, recursively.
fn readonly(sys: &dyn Syscall, tree: &OwnedFd, what: &str) -> Result<()> {
    sys.mount_setattr(
        tree.as_fd(),
        true,
        MountAttrFlags::MOUNT_ATTR_RDONLY,
        MountAttrFlags::empty(),
    )
    .map_err(sys_err(format!("{what}: making it read-only")))
}

/// Mounts the view of its own cgroup a sandbox has at `target` (see
/// [`Step::CgroupView`]). The host's /sys/fs/cgroup lists every cgroup,
/// other sandboxes' among them: the tmpfs covers it (a cover that the
/// sandbox, holding no capability over this mount namespace, cannot
/// remove). A cgroup v2 view is bound at `target` itself.
fn cgroup_view(
    sys: &dyn Syscall,
    target: BorrowedFd<'_>,
    views: &[(String, PathBuf)],
) -> Result<()> {
    let what = "mounting the sandbox's /sys/fs/cgroup";
    if let [(name, dir)] = views {
        if name.is_empty() {
            let t = clone_host(sys, dir, what).map_err(|(_, e)| e)?;
            readonly(sys, &t, what)?;
            return attach(sys, &t, target, what);
        }
    }
    let top = make_fs(
        sys,
        &Fs::Tmpfs {
            mode: 0o755,
            size: 64 << 10,
        },
        Attrs::NOSUID_NODEV_NOEXEC,
        what,
    )?;
    attach(sys, &top, target, what)?;
    for (name, dir) in views {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            continue;
        }
        rustix::fs::mkdirat(&top, name.as_str(), Mode::from_raw_mode(0o555))
            .map_err(sys_err(format!("{what}: creating {name}")))?;
        let sub = beneath::open_beneath(&top, Path::new(name), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(sys_err(format!("{what}: opening {name}")))?;
        let t = clone_host(sys, dir, what).map_err(|(_, e)| e)?;
        attach(sys, &t, sub.as_fd(), what)?;
        // `cpu,cpuacct` is also found as `cpu` and `cpuacct`, as on hosts.
        if name.contains(',') {
            for c in name.split(',') {
                if !c.is_empty() && !views.iter().any(|(n, _)| n == c) {
                    let _ = rustix::fs::symlinkat(name.as_str(), &top, c);
                }
            }
        }
    }
    readonly(sys, &top, what)
}

/// Carries out `steps` on `root`, every mount through `sys`.
pub fn apply(sys: &dyn Syscall, root: &mut NewRoot, steps: &[Step]) -> Result<()> {
    for step in steps {
        apply_one(sys, root, step)?;
    }
    Ok(())
}

fn apply_one(sys: &dyn Syscall, root: &mut NewRoot, step: &Step) -> Result<()> {
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
            let mnt = make_fs(sys, fs, *attrs, &what)?;
            attach(sys, &mnt, target.as_fd(), &what)?;
            if let Some(b) = names {
                root.mounts.insert(*b, mnt);
            }
            Ok(())
        }
        Step::Sys { at, own_netns } => sysfs(sys, root, at, *own_netns),
        Step::BindHost {
            src,
            at,
            readonly: ro,
            need,
        } => {
            let what = format!("binding {} at {}", src.display(), at.shown());
            match (bind_host(sys, root, src, at, *ro, &what), need) {
                (Ok(()), _) | (Err((Errno::NOENT, _)), Need::IfOnHost) => Ok(()),
                (Err((_, e)), Need::BestEffort) => {
                    tracing::debug!("not {what}: {e}");
                    Ok(())
                }
                (Err((_, e)), _) => Err(e),
            }
        }
        Step::Guarded { src, at, dst } => {
            let what = format!("binding {} at {} (guarded)", src.display(), at.shown());
            let (tree, kind) = clone_dir(sys, src, &what)?;
            let (writable, _) = clone_dir(sys, src, &what)?;
            let target = root
                .resolve(at, Some(kind))?
                .ok_or_else(|| RootfsError::NowhereToAttach { step: what.clone() })?;
            readonly(sys, &tree, &what)?;
            attach(sys, &tree, target.as_fd(), &what)?;
            root.guarded.push((dst.clone(), writable));
            Ok(())
        }
        Step::File { at, contents } => own_file(sys, root, at, contents),
        Step::CgroupView { at, views } => match root.resolve(at, None)? {
            Some(target) => cgroup_view(sys, target.as_fd(), views),
            None => Ok(()),
        },
        Step::ReadOnly { at } => {
            let Some(target) = root.resolve(at, None)? else {
                return Ok(());
            };
            let what = format!("covering {} read-only", at.shown());
            let tree = sys
                .open_tree(
                    target.as_fd(),
                    Path::new(""),
                    OpenTreeFlags::OPEN_TREE_CLONE
                        | OpenTreeFlags::OPEN_TREE_CLOEXEC
                        | OpenTreeFlags::AT_EMPTY_PATH
                        | OpenTreeFlags::AT_RECURSIVE,
                )
                .map_err(sys_err(format!("{what}: cloning it")))?;
            readonly(sys, &tree, &what)?;
            attach(sys, &tree, target.as_fd(), &what)
        }
        Step::Mask { at } => mask(sys, root, at),
        Step::MakeDir { at, mode } => make_dir(root, at, *mode),
        Step::Symlink { at, target } => {
            let Some(base) = root.base(at.base) else {
                return Ok(());
            };
            let (parent, name) = split_beneath(base, at)?;
            rustix::fs::symlinkat(target.as_path(), &parent, name)
                .map_err(sys_err(format!("creating {}", at.shown())))
        }
        Step::LayerDir { name, at } => {
            let what = format!("the writable layer's dir at {}", at.shown());
            let Some(layer) = root.layer.as_ref() else {
                return Err(RootfsError::NoLayer { step: what });
            };
            let tree = sys
                .open_tree(
                    layer.as_fd(),
                    Path::new(name),
                    OpenTreeFlags::OPEN_TREE_CLONE
                        | OpenTreeFlags::OPEN_TREE_CLOEXEC
                        | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(sys_err(format!("{what}: cloning it")))?;
            let Some(target) = root.resolve(at, Some(Create::Dir))? else {
                return Err(RootfsError::NowhereToAttach { step: what });
            };
            attach(sys, &tree, target.as_fd(), &what)
        }
    }
}

/// [`Step::Sys`]: a fresh read-only sysfs where the sandbox has its own
/// network namespace, else the host's bound read-only; left empty when
/// the kernel allows neither.
fn sysfs(sys: &dyn Syscall, root: &mut NewRoot, at: &At, own_netns: bool) -> Result<()> {
    let Some(target) = root.resolve(at, None)? else {
        return Ok(());
    };
    let fresh = own_netns
        .then(|| {
            let attrs = Attrs {
                readonly: true,
                ..Attrs::NOSUID_NODEV_NOEXEC
            };
            sys.fs_mount(
                "sysfs",
                &[FsParam::set("source", "sysfs").optional()],
                attrs.flags(),
            )
            .ok()
        })
        .flatten();
    let tree = match fresh {
        Some(t) => Some(t),
        None => clone_host(sys, Path::new("/sys"), "/sys")
            .ok()
            .filter(|t| readonly(sys, t, "/sys").is_ok()),
    };
    match tree {
        Some(t) => match attach(sys, &t, target.as_fd(), "/sys") {
            Ok(()) => {
                root.mounts.insert(Base::Sys, t);
            }
            Err(e) => tracing::debug!("leaving /sys empty: {e}"),
        },
        None => tracing::debug!("leaving /sys empty: the kernel allows no sysfs here"),
    }
    Ok(())
}

/// [`Step::File`]: the file made in a small fresh tmpfs, bound over `at`.
fn own_file(sys: &dyn Syscall, root: &NewRoot, at: &At, contents: &[u8]) -> Result<()> {
    let Some(target) = root.resolve(at, None)? else {
        return Ok(());
    };
    let what = format!("writing {}", at.shown());
    let fs = make_fs(
        sys,
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
        .map_err(|source| RootfsError::Write {
            step: what.clone(),
            source,
        })?;
    let tree = sys
        .open_tree(
            fs.as_fd(),
            Path::new("file"),
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(sys_err(format!("{what}: cloning it")))?;
    attach(sys, &tree, target.as_fd(), &what)
}

/// [`Step::Mask`]: a file under the host's /dev/null, a directory under
/// an empty read-only tmpfs (clones of the first one).
fn mask(sys: &dyn Syscall, root: &mut NewRoot, at: &At) -> Result<()> {
    let Some(target) = root.resolve(at, None)? else {
        return Ok(());
    };
    let what = format!("masking {}", at.shown());
    let st = rustix::fs::fstat(&target).map_err(sys_err(&what))?;
    let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
    let tree = if is_dir {
        match &root.empty {
            Some(empty) => sys
                .open_tree(
                    empty.as_fd(),
                    Path::new(""),
                    OpenTreeFlags::OPEN_TREE_CLONE
                        | OpenTreeFlags::OPEN_TREE_CLOEXEC
                        | OpenTreeFlags::AT_EMPTY_PATH,
                )
                .map_err(sys_err(format!("{what}: cloning the empty mount")))?,
            None => make_fs(
                sys,
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
        let t = clone_host(sys, Path::new("/dev/null"), &what).map_err(|(_, e)| e)?;
        readonly(sys, &t, &what)?;
        t
    };
    attach(sys, &tree, target.as_fd(), &what)?;
    if root.empty.is_none() && is_dir {
        root.empty = Some(tree);
    }
    Ok(())
}

/// [`Step::MakeDir`]: made with `mode` only when missing.
fn make_dir(root: &NewRoot, at: &At, mode: u32) -> Result<()> {
    let Some(base) = root.base(at.base) else {
        return Ok(());
    };
    let exists = beneath::open_in_root(base, &at.path, OFlags::PATH);
    if exists.is_ok() {
        return Ok(());
    }
    root.resolve(at, None)?;
    // Reopened for fchmod (an O_PATH fd cannot change modes); the umask
    // must not decide a world-writable /tmp.
    let dir = beneath::open_in_root(base, &at.path, OFlags::RDONLY | OFlags::DIRECTORY)
        .map_err(sys_err(format!("opening {}", at.shown())))?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))
        .map_err(sys_err(format!("chmod {}", at.shown())))
}

fn bind_host(
    sys: &dyn Syscall,
    root: &NewRoot,
    src: &Path,
    at: &At,
    ro: bool,
    what: &str,
) -> std::result::Result<(), (Errno, RootfsError)> {
    let tree = clone_host(sys, src, what)?;
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
                RootfsError::NowhereToAttach {
                    step: what.to_string(),
                },
            )
        })?;
    if ro {
        readonly(sys, &tree, what).map_err(|e| (Errno::INVAL, e))?;
    }
    attach(sys, &tree, target.as_fd(), what).map_err(|e| (Errno::INVAL, e))
}

/// A detached clone of the host directory `src` (a guarded bind's),
/// checked to be a directory.
fn clone_dir(sys: &dyn Syscall, src: &Path, what: &str) -> Result<(OwnedFd, Create)> {
    let tree = clone_host(sys, src, what).map_err(|(_, e)| e)?;
    let st = rustix::fs::fstat(&tree).map_err(sys_err(what))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(RootfsError::NotADirectory {
            step: what.to_string(),
            src: src.to_path_buf(),
        });
    }
    Ok((tree, Create::Dir))
}

/// Mounts each writable clone of a guarded bind in `trees` (from
/// [`NewRoot::take_guarded`]) over its read-only bind at its path, in the
/// guarded mount namespace that the calling process has just made (after
/// the pivot: the path is the sandbox's, looked up as the image left it,
/// as the bind's was; nothing inside has run yet).
pub fn attach_guarded(sys: &dyn Syscall, trees: &[(PathBuf, OwnedFd)]) -> Result<()> {
    for (dst, tree) in trees {
        let what = format!("mounting {} writable for guarded requests", dst.display());
        let target = rustix::fs::open(
            dst,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(sys_err(format!("{what}: opening it")))?;
        attach(sys, tree, target.as_fd(), &what)?;
    }
    Ok(())
}

/// Makes `root` the root of this mount namespace and detaches the old one.
pub fn pivot(sys: &dyn Syscall, root: &NewRoot) -> Result<()> {
    sys.fchdir(root.fd.as_fd())
        .map_err(sys_err("changing to the new root"))?;
    sys.pivot_root(Path::new("."), Path::new("."))
        .map_err(sys_err("pivot_root"))?;
    sys.umount(Path::new("."), UnmountFlags::DETACH)
        .map_err(sys_err("detaching the old root"))?;
    sys.chdir(Path::new("/")).map_err(sys_err("chdir /"))?;
    Ok(())
}
