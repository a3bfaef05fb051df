//! The system calls that assemble and run a sandbox, behind one trait.
//!
//! [`Syscall`] is the seam (youki's model): the engine's root assembly
//! (`rootfs`), init, outer and the worker call the kernel through a
//! `&dyn Syscall` handed down from their entry points, never through a
//! global. [`Kernel`] makes the real calls (one vtable call each, nothing
//! more); [`fake::Recorder`] (feature `fake`, for tests) records each call
//! with its arguments and flags and fails any chosen one with a chosen
//! errno, so the mount and namespace logic is unit-tested as any user.
//!
//! What is here is what needs privilege or changes the process or the
//! mount table: making, cloning, attaching and changing mounts, the pivot,
//! namespaces, prctl, the host name, device nodes, and the writes of id
//! maps and cgroup files, and the removal of cgroups. Lookups and file operations on the trees those
//! calls return (`openat2`, `mkdirat`, `fstat`, ...) stay plain calls on
//! the fds: they need no privilege, so they run unchanged on the fake's
//! trees, which are scratch directories.

use std::ffi::CStr;
use std::io::Write as _;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Dev, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountFlags, MountPropagationFlags, MoveMountFlags,
    OpenTreeFlags, UnmountFlags,
};
use rustix::process::Signal;
use rustix::thread::{LinkNameSpaceType, UnshareFlags};

#[cfg(feature = "fake")]
pub mod fake;

/// One parameter of a file system context (`fsconfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsParam<'a> {
    pub key: &'a str,
    /// `None` for a flag (`FSCONFIG_SET_FLAG`).
    pub value: Option<&'a str>,
    /// A parameter the file system may refuse (the `source` name, devpts's
    /// `newinstance`): its failure is ignored.
    pub optional: bool,
}

impl<'a> FsParam<'a> {
    /// A string parameter that must be accepted.
    pub fn set(key: &'a str, value: &'a str) -> FsParam<'a> {
        FsParam {
            key,
            value: Some(value),
            optional: false,
        }
    }

    /// A flag that must be accepted.
    pub fn flag(key: &'a str) -> FsParam<'a> {
        FsParam {
            key,
            value: None,
            optional: false,
        }
    }

    /// The same parameter, its failure ignored.
    pub fn optional(self) -> FsParam<'a> {
        FsParam {
            optional: true,
            ..self
        }
    }
}

/// Where making a file system failed, with the errno and the messages the
/// kernel logged on the context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{stage}{}: {}", log_text(.log), std::io::Error::from(*.errno))]
pub struct FsError {
    /// `fsopen(tmpfs)`, `size=4096`, `creating tmpfs`, `fsmount(tmpfs)`.
    pub stage: String,
    pub errno: Errno,
    pub log: Vec<String>,
}

fn log_text(log: &[String]) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!(" ({})", log.join("; "))
    }
}

/// The `prctl` calls sifbox makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prctl {
    /// `PR_SET_PDEATHSIG`.
    ParentDeathSignal(Option<Signal>),
    /// `PR_SET_DUMPABLE` 0.
    NotDumpable,
    /// `PR_SET_CHILD_SUBREAPER` on.
    ChildSubreaper,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs,
}

/// The system calls that assemble and run a sandbox. Paths and fds are
/// passed as the caller has them; flags are rustix's values.
pub trait Syscall {
    /// A fresh file system `fstype` configured with `params` and mounted
    /// detached with `attrs` (`fsopen`, `fsconfig`..., `fsmount`).
    fn fs_mount(
        &self,
        fstype: &str,
        params: &[FsParam<'_>],
        attrs: MountAttrFlags,
    ) -> Result<OwnedFd, FsError>;
    /// `open_tree(dir, path, flags)`: with `OPEN_TREE_CLONE`, a detached
    /// copy of the mount (tree) there.
    fn open_tree(
        &self,
        dir: BorrowedFd<'_>,
        path: &Path,
        flags: OpenTreeFlags,
    ) -> Result<OwnedFd, Errno>;
    /// `move_mount(from, from_path, to, to_path, flags)`: attaches a
    /// detached tree.
    fn move_mount(
        &self,
        from: BorrowedFd<'_>,
        from_path: &Path,
        to: BorrowedFd<'_>,
        to_path: &Path,
        flags: MoveMountFlags,
    ) -> Result<(), Errno>;
    /// `mount_setattr(tree, "", AT_EMPTY_PATH [| AT_RECURSIVE])`, setting
    /// `set` and clearing `clear`.
    fn mount_setattr(
        &self,
        tree: BorrowedFd<'_>,
        recursive: bool,
        set: MountAttrFlags,
        clear: MountAttrFlags,
    ) -> Result<(), Errno>;
    /// `mount(2)`.
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MountFlags,
        data: Option<&CStr>,
    ) -> Result<(), Errno>;
    /// `mount(2)` changing the propagation of the mount at `target`.
    fn mount_propagation(&self, target: &Path, flags: MountPropagationFlags) -> Result<(), Errno>;
    /// `umount2(target, flags)`.
    fn umount(&self, target: &Path, flags: UnmountFlags) -> Result<(), Errno>;
    /// `pivot_root(new_root, put_old)`.
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> Result<(), Errno>;
    /// `fchdir(dir)`.
    fn fchdir(&self, dir: BorrowedFd<'_>) -> Result<(), Errno>;
    /// `chdir(path)`.
    fn chdir(&self, path: &Path) -> Result<(), Errno>;
    /// `mknodat(dir, name, kind | mode, dev)`.
    fn mknodat(
        &self,
        dir: BorrowedFd<'_>,
        name: &Path,
        kind: FileType,
        mode: Mode,
        dev: Dev,
    ) -> Result<(), Errno>;
    /// `setns(ns, kind)`.
    fn setns(&self, ns: BorrowedFd<'_>, kind: Option<LinkNameSpaceType>) -> Result<(), Errno>;
    /// `unshare(flags)`.
    fn unshare(&self, flags: UnshareFlags) -> Result<(), Errno>;
    /// One `prctl`.
    fn prctl(&self, op: Prctl) -> Result<(), Errno>;
    /// `sethostname(name)`.
    fn sethostname(&self, name: &[u8]) -> Result<(), Errno>;
    /// Writes `data` in one `write` to the existing file `name` beneath
    /// `dir` (an id map under /proc/PID, a cgroup's control file).
    fn write_file(&self, dir: BorrowedFd<'_>, name: &Path, data: &[u8]) -> Result<(), Errno>;
    /// Removes the empty directory `name` beneath `dir` (a cgroup:
    /// `unlinkat(dir, name, AT_REMOVEDIR)`).
    fn remove_dir(&self, dir: BorrowedFd<'_>, name: &Path) -> Result<(), Errno>;
}

/// The real system calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kernel;

/// The messages the kernel logged on a file system context.
fn fs_log(ctx: &OwnedFd) -> Vec<String> {
    let mut log = Vec::new();
    let mut buf = [0u8; 256];
    while let Ok(n) = rustix::io::read(ctx, &mut buf) {
        if n == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf[..n]);
        log.push(line.trim_start_matches("e ").trim().to_string());
    }
    log
}

impl Syscall for Kernel {
    fn fs_mount(
        &self,
        fstype: &str,
        params: &[FsParam<'_>],
        attrs: MountAttrFlags,
    ) -> Result<OwnedFd, FsError> {
        use rustix::mount::{
            fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen,
        };
        let ctx = fsopen(fstype, FsOpenFlags::FSOPEN_CLOEXEC).map_err(|errno| FsError {
            stage: format!("fsopen({fstype})"),
            errno,
            log: Vec::new(),
        })?;
        let failed = |stage: String, errno: Errno| FsError {
            stage,
            errno,
            log: fs_log(&ctx),
        };
        for p in params {
            let set = match p.value {
                Some(v) => fsconfig_set_string(&ctx, p.key, v),
                None => fsconfig_set_flag(&ctx, p.key),
            };
            match (set, p.value) {
                (Ok(()), _) => {}
                (Err(_), _) if p.optional => {}
                (Err(e), Some(v)) => return Err(failed(format!("{}={v}", p.key), e)),
                (Err(e), None) => return Err(failed(p.key.to_string(), e)),
            }
        }
        fsconfig_create(&ctx).map_err(|e| failed(format!("creating {fstype}"), e))?;
        fsmount(&ctx, FsMountFlags::FSMOUNT_CLOEXEC, attrs)
            .map_err(|e| failed(format!("fsmount({fstype})"), e))
    }

    fn open_tree(
        &self,
        dir: BorrowedFd<'_>,
        path: &Path,
        flags: OpenTreeFlags,
    ) -> Result<OwnedFd, Errno> {
        rustix::mount::open_tree(dir, path, flags)
    }

    fn move_mount(
        &self,
        from: BorrowedFd<'_>,
        from_path: &Path,
        to: BorrowedFd<'_>,
        to_path: &Path,
        flags: MoveMountFlags,
    ) -> Result<(), Errno> {
        rustix::mount::move_mount(from, from_path, to, to_path, flags)
    }

    fn mount_setattr(
        &self,
        tree: BorrowedFd<'_>,
        recursive: bool,
        set: MountAttrFlags,
        clear: MountAttrFlags,
    ) -> Result<(), Errno> {
        crate::mount_setattr(tree, recursive, set.bits().into(), clear.bits().into())
    }

    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MountFlags,
        data: Option<&CStr>,
    ) -> Result<(), Errno> {
        rustix::mount::mount(source, target, fstype, flags, data)
    }

    fn mount_propagation(&self, target: &Path, flags: MountPropagationFlags) -> Result<(), Errno> {
        rustix::mount::mount_change(target, flags)
    }

    fn umount(&self, target: &Path, flags: UnmountFlags) -> Result<(), Errno> {
        rustix::mount::unmount(target, flags)
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> Result<(), Errno> {
        rustix::process::pivot_root(new_root, put_old)
    }

    fn fchdir(&self, dir: BorrowedFd<'_>) -> Result<(), Errno> {
        rustix::process::fchdir(dir)
    }

    fn chdir(&self, path: &Path) -> Result<(), Errno> {
        rustix::process::chdir(path)
    }

    fn mknodat(
        &self,
        dir: BorrowedFd<'_>,
        name: &Path,
        kind: FileType,
        mode: Mode,
        dev: Dev,
    ) -> Result<(), Errno> {
        rustix::fs::mknodat(dir, name, kind, mode, dev)
    }

    fn setns(&self, ns: BorrowedFd<'_>, kind: Option<LinkNameSpaceType>) -> Result<(), Errno> {
        rustix::thread::move_into_link_name_space(ns, kind)
    }

    fn unshare(&self, flags: UnshareFlags) -> Result<(), Errno> {
        crate::unshare_namespaces(flags)
            .map_err(|e| Errno::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EINVAL)))
    }

    fn prctl(&self, op: Prctl) -> Result<(), Errno> {
        match op {
            Prctl::ParentDeathSignal(sig) => rustix::process::set_parent_process_death_signal(sig),
            Prctl::NotDumpable => rustix::process::set_dumpable_behavior(
                rustix::process::DumpableBehavior::NotDumpable,
            ),
            Prctl::ChildSubreaper => {
                rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            }
            Prctl::NoNewPrivs => rustix::thread::set_no_new_privs(true),
        }
    }

    fn sethostname(&self, name: &[u8]) -> Result<(), Errno> {
        rustix::system::sethostname(name)
    }

    fn write_file(&self, dir: BorrowedFd<'_>, name: &Path, data: &[u8]) -> Result<(), Errno> {
        // Append mode: kernel files (id maps, cgroup files) ignore the
        // offset, and a plain file standing for one in a test keeps every
        // write.
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut f = std::fs::File::from(fd);
        f.write_all(data)
            .map_err(|e| Errno::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    fn remove_dir(&self, dir: BorrowedFd<'_>, name: &Path) -> Result<(), Errno> {
        rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::REMOVEDIR)
    }
}
