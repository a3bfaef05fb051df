//! A [`Syscall`] that records each call and makes no privileged one, for
//! unit tests run as any user (feature `fake`).
//!
//! The trees it returns are scratch directories (or files) of its own, one
//! per tree: what the code under test does on them with plain fd calls
//! (`mkdirat`, `openat2`, `fstat`, writes) works as on a real mount. A
//! clone (`open_tree`) of a directory is a directory, of anything else a
//! file, so callers that look at what they cloned see the right kind; a
//! file system can be seeded with entries ([`Recorder::seed`]), so that
//! what lies in a real `/proc` is there to be masked.
//!
//! Every fd argument is recorded as an [`Obj`]: a tree this recorder made
//! (and the path inside it), or a host path. [`Recorder::fail`] makes the
//! nth call of a name fail with an errno; [`Recorder::open_trees`] tells
//! which trees are still open, to check that a failure left none behind.

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{Dev, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;
use rustix::mount::{
    MountAttrFlags, MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};
use rustix::thread::{LinkNameSpaceType, UnshareFlags};

use super::{FsError, FsParam, Prctl, Syscall};

/// What an fd (or a path) given to a call referred to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obj {
    /// The tree this recorder made `n`th (from 0), and the path inside it.
    Tree(usize, PathBuf),
    /// A path of the host (the test's own directories among them).
    Host(PathBuf),
}

impl Obj {
    /// The tree this is in, if one of the recorder's.
    pub fn tree(&self) -> Option<usize> {
        match self {
            Obj::Tree(n, _) => Some(*n),
            Obj::Host(_) => None,
        }
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    FsMount {
        fstype: String,
        /// `(key, value)`; a flag has no value.
        params: Vec<(String, Option<String>)>,
        attrs: MountAttrFlags,
        /// The tree returned (none when the call failed).
        tree: Option<usize>,
    },
    OpenTree {
        source: Obj,
        flags: OpenTreeFlags,
        tree: Option<usize>,
    },
    MoveMount {
        from: Obj,
        to: Obj,
        flags: MoveMountFlags,
    },
    MountSetattr {
        tree: Obj,
        recursive: bool,
        set: MountAttrFlags,
        clear: MountAttrFlags,
    },
    Mount {
        source: String,
        target: Obj,
        fstype: String,
        flags: MountFlags,
        data: Option<String>,
    },
    MountPropagation {
        target: PathBuf,
        flags: MountPropagationFlags,
    },
    Umount {
        target: PathBuf,
        flags: UnmountFlags,
    },
    PivotRoot {
        new_root: PathBuf,
        put_old: PathBuf,
    },
    Fchdir {
        dir: Obj,
    },
    Chdir {
        path: PathBuf,
    },
    Mknod {
        at: Obj,
        kind: FileType,
        mode: Mode,
        dev: Dev,
    },
    Setns {
        ns: Obj,
        kind: Option<LinkNameSpaceType>,
    },
    Unshare {
        flags: UnshareFlags,
    },
    Prctl(Prctl),
    Sethostname {
        name: Vec<u8>,
    },
    WriteFile {
        at: Obj,
        data: Vec<u8>,
    },
    RemoveDir {
        at: Obj,
    },
}

impl Call {
    /// The name [`Recorder::fail`] matches: the system call's.
    pub fn name(&self) -> &'static str {
        match self {
            Call::FsMount { .. } => "fs_mount",
            Call::OpenTree { .. } => "open_tree",
            Call::MoveMount { .. } => "move_mount",
            Call::MountSetattr { .. } => "mount_setattr",
            Call::Mount { .. } => "mount",
            Call::MountPropagation { .. } => "mount_propagation",
            Call::Umount { .. } => "umount",
            Call::PivotRoot { .. } => "pivot_root",
            Call::Fchdir { .. } => "fchdir",
            Call::Chdir { .. } => "chdir",
            Call::Mknod { .. } => "mknod",
            Call::Setns { .. } => "setns",
            Call::Unshare { .. } => "unshare",
            Call::Prctl(_) => "prctl",
            Call::Sethostname { .. } => "sethostname",
            Call::WriteFile { .. } => "write_file",
            Call::RemoveDir { .. } => "remove_dir",
        }
    }
}

/// A recorded call and the errno it was made to fail with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub call: Call,
    pub failed: Option<Errno>,
}

#[derive(Default)]
struct State {
    log: Vec<Entry>,
    counts: HashMap<&'static str, usize>,
    fails: Vec<(&'static str, usize, Errno)>,
    seeds: HashMap<String, Vec<String>>,
    trees: usize,
    apply_files: bool,
}

/// The recording fake (see the module note).
pub struct Recorder {
    scratch: tempfile::TempDir,
    state: Mutex<State>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("scratch", &self.scratch.path())
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder with its scratch directory.
    ///
    /// # Panics
    /// When no temporary directory can be made (a test's setup).
    #[allow(clippy::expect_used)]
    pub fn new() -> Recorder {
        Recorder {
            scratch: tempfile::tempdir().expect("a scratch dir for the recorder"),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the `nth` (from 1) call named `name` ([`Call::name`]) fail
    /// with `errno`.
    pub fn fail(&self, name: &'static str, nth: usize, errno: Errno) {
        self.state().fails.push((name, nth, errno));
    }

    /// What each file system `fstype` made from now on holds: paths
    /// relative to its root, a trailing `/` for a directory.
    pub fn seed(&self, fstype: &str, entries: &[&str]) {
        self.state().seeds.insert(
            fstype.to_string(),
            entries.iter().map(|e| (*e).to_string()).collect(),
        );
    }

    /// From now on, a `write_file` or `remove_dir` that is let through is
    /// also done on the file system (a write appends, as a kernel file
    /// keeps no offset): for code that reads back what it wrote, the
    /// cgroup code on a fake cgroup tree of plain files.
    pub fn apply_files(&self) {
        self.state().apply_files = true;
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Entry> {
        self.state().log.clone()
    }

    /// The directory (or file) that stands for tree `n`.
    pub fn tree_path(&self, n: usize) -> PathBuf {
        self.scratch.path().join(format!("t{n}"))
    }

    /// The trees (by number) that an fd of this process still refers to.
    pub fn open_trees(&self) -> Vec<usize> {
        let mut open = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            for e in dir.flatten() {
                if let Ok(target) = std::fs::read_link(e.path()) {
                    if let Obj::Tree(n, inside) = self.obj_of_path(&target) {
                        if inside.as_os_str().is_empty() && !open.contains(&n) {
                            open.push(n);
                        }
                    }
                }
            }
        }
        open.sort_unstable();
        open
    }

    fn obj_of_path(&self, p: &Path) -> Obj {
        if let Ok(rest) = p.strip_prefix(self.scratch.path()) {
            let mut parts = rest.iter();
            if let Some(n) = parts
                .next()
                .and_then(|t| t.to_str())
                .and_then(|t| t.strip_prefix('t'))
                .and_then(|n| n.parse().ok())
            {
                return Obj::Tree(n, parts.collect());
            }
        }
        Obj::Host(p.to_path_buf())
    }

    /// What `fd` (joined with `path`, when not empty) refers to.
    pub fn obj(&self, fd: BorrowedFd<'_>, path: &Path) -> Obj {
        let base = if fd.as_raw_fd() == CWD.as_raw_fd() {
            std::env::current_dir().unwrap_or_default()
        } else {
            std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
        };
        self.obj_of_path(&base.join(path))
    }

    /// Records `call`; the errno it is to fail with, if any.
    fn record(&self, call: Call) -> Result<(), Errno> {
        let mut st = self.state();
        let name = call.name();
        let n = {
            let c = st.counts.entry(name).or_insert(0);
            *c += 1;
            *c
        };
        let failed = st
            .fails
            .iter()
            .find(|(f, nth, _)| *f == name && *nth == n)
            .map(|(_, _, e)| *e);
        st.log.push(Entry { call, failed });
        failed.map_or(Ok(()), Err)
    }

    /// Sets the tree of the last recorded call (made after the call was
    /// let through).
    fn set_last_tree(&self, made: usize) {
        if let Some(Entry {
            call: Call::FsMount { tree, .. } | Call::OpenTree { tree, .. },
            ..
        }) = self.state().log.last_mut()
        {
            *tree = Some(made);
        }
    }

    /// A new scratch tree: a directory (with `entries`) or a file.
    fn new_tree(&self, dir: bool, entries: &[String]) -> Result<(usize, OwnedFd), Errno> {
        let n = {
            let mut st = self.state();
            st.trees += 1;
            st.trees - 1
        };
        let p = self.tree_path(n);
        let io = |e: std::io::Error| Errno::from_io_error(&e).unwrap_or(Errno::IO);
        if dir {
            std::fs::create_dir(&p).map_err(io)?;
            for e in entries {
                let at = p.join(e.trim_end_matches('/'));
                if let Some(parent) = at.parent() {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                if e.ends_with('/') {
                    std::fs::create_dir_all(&at).map_err(io)?;
                } else {
                    std::fs::write(&at, b"").map_err(io)?;
                }
            }
        } else {
            std::fs::write(&p, b"").map_err(io)?;
        }
        let fd = rustix::fs::open(&p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
        Ok((n, fd))
    }
}

impl Syscall for Recorder {
    fn fs_mount(
        &self,
        fstype: &str,
        params: &[FsParam<'_>],
        attrs: MountAttrFlags,
    ) -> Result<OwnedFd, FsError> {
        let call = Call::FsMount {
            fstype: fstype.to_string(),
            params: params
                .iter()
                .map(|p| (p.key.to_string(), p.value.map(str::to_string)))
                .collect(),
            attrs,
            tree: None,
        };
        let fs_error = |errno| FsError {
            stage: format!("fsmount({fstype})"),
            errno,
            log: Vec::new(),
        };
        self.record(call).map_err(fs_error)?;
        let seed = self.state().seeds.get(fstype).cloned().unwrap_or_default();
        let (n, fd) = self.new_tree(true, &seed).map_err(fs_error)?;
        self.set_last_tree(n);
        Ok(fd)
    }

    fn open_tree(
        &self,
        dir: BorrowedFd<'_>,
        path: &Path,
        flags: OpenTreeFlags,
    ) -> Result<OwnedFd, Errno> {
        self.record(Call::OpenTree {
            source: self.obj(dir, path),
            flags,
            tree: None,
        })?;
        // The source must exist, as for the kernel.
        let mut how = OFlags::PATH | OFlags::CLOEXEC;
        if flags.contains(OpenTreeFlags::AT_SYMLINK_NOFOLLOW) {
            how |= OFlags::NOFOLLOW;
        }
        let src = if path.as_os_str().is_empty() {
            rustix::io::fcntl_dupfd_cloexec(dir, 3)?
        } else {
            rustix::fs::openat(dir, path, how, Mode::empty())?
        };
        let st = rustix::fs::fstat(&src)?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        let (n, fd) = self.new_tree(is_dir, &[])?;
        self.set_last_tree(n);
        Ok(fd)
    }

    fn move_mount(
        &self,
        from: BorrowedFd<'_>,
        from_path: &Path,
        to: BorrowedFd<'_>,
        to_path: &Path,
        flags: MoveMountFlags,
    ) -> Result<(), Errno> {
        self.record(Call::MoveMount {
            from: self.obj(from, from_path),
            to: self.obj(to, to_path),
            flags,
        })
    }

    fn mount_setattr(
        &self,
        tree: BorrowedFd<'_>,
        recursive: bool,
        set: MountAttrFlags,
        clear: MountAttrFlags,
    ) -> Result<(), Errno> {
        self.record(Call::MountSetattr {
            tree: self.obj(tree, Path::new("")),
            recursive,
            set,
            clear,
        })
    }

    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MountFlags,
        data: Option<&CStr>,
    ) -> Result<(), Errno> {
        let target = std::fs::read_link(target).unwrap_or_else(|_| target.to_path_buf());
        self.record(Call::Mount {
            source: source.to_string(),
            target: self.obj_of_path(&target),
            fstype: fstype.to_string(),
            flags,
            data: data.map(|d| d.to_string_lossy().into_owned()),
        })
    }

    fn mount_propagation(&self, target: &Path, flags: MountPropagationFlags) -> Result<(), Errno> {
        self.record(Call::MountPropagation {
            target: target.to_path_buf(),
            flags,
        })
    }

    fn umount(&self, target: &Path, flags: UnmountFlags) -> Result<(), Errno> {
        self.record(Call::Umount {
            target: target.to_path_buf(),
            flags,
        })
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> Result<(), Errno> {
        self.record(Call::PivotRoot {
            new_root: new_root.to_path_buf(),
            put_old: put_old.to_path_buf(),
        })
    }

    fn fchdir(&self, dir: BorrowedFd<'_>) -> Result<(), Errno> {
        self.record(Call::Fchdir {
            dir: self.obj(dir, Path::new("")),
        })
    }

    fn chdir(&self, path: &Path) -> Result<(), Errno> {
        self.record(Call::Chdir {
            path: path.to_path_buf(),
        })
    }

    fn mknodat(
        &self,
        dir: BorrowedFd<'_>,
        name: &Path,
        kind: FileType,
        mode: Mode,
        dev: Dev,
    ) -> Result<(), Errno> {
        self.record(Call::Mknod {
            at: self.obj(dir, name),
            kind,
            mode,
            dev,
        })
    }

    fn setns(&self, ns: BorrowedFd<'_>, kind: Option<LinkNameSpaceType>) -> Result<(), Errno> {
        self.record(Call::Setns {
            ns: self.obj(ns, Path::new("")),
            kind,
        })
    }

    fn unshare(&self, flags: UnshareFlags) -> Result<(), Errno> {
        self.record(Call::Unshare { flags })
    }

    fn prctl(&self, op: Prctl) -> Result<(), Errno> {
        self.record(Call::Prctl(op))
    }

    fn sethostname(&self, name: &[u8]) -> Result<(), Errno> {
        self.record(Call::Sethostname {
            name: name.to_vec(),
        })
    }

    fn write_file(&self, dir: BorrowedFd<'_>, name: &Path, data: &[u8]) -> Result<(), Errno> {
        self.record(Call::WriteFile {
            at: self.obj(dir, name),
            data: data.to_vec(),
        })?;
        if self.state().apply_files {
            let fd = rustix::fs::openat(
                dir,
                name,
                OFlags::WRONLY | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let mut f = std::fs::File::from(fd);
            std::io::Write::write_all(&mut f, data)
                .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        }
        Ok(())
    }

    fn remove_dir(&self, dir: BorrowedFd<'_>, name: &Path) -> Result<(), Errno> {
        self.record(Call::RemoveDir {
            at: self.obj(dir, name),
        })?;
        if self.state().apply_files {
            rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::REMOVEDIR)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn records_calls_and_fails_the_chosen_one() {
        let r = Recorder::new();
        r.fail("move_mount", 2, Errno::PERM);
        let t = r
            .fs_mount(
                "tmpfs",
                &[FsParam::set("size", "4096")],
                MountAttrFlags::MOUNT_ATTR_RDONLY,
            )
            .expect("test setup");
        let dir = tempfile::tempdir().expect("test setup");
        let target = rustix::fs::open(dir.path(), OFlags::PATH, Mode::empty()).expect("test setup");
        let flags = MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH;
        assert!(r
            .move_mount(
                t.as_fd(),
                Path::new(""),
                target.as_fd(),
                Path::new(""),
                flags
            )
            .is_ok());
        assert_eq!(
            r.move_mount(
                t.as_fd(),
                Path::new(""),
                target.as_fd(),
                Path::new(""),
                flags
            ),
            Err(Errno::PERM)
        );
        let calls = r.calls();
        assert_eq!(calls.len(), 3);
        assert!(matches!(
            &calls[0].call,
            Call::FsMount { tree: Some(0), .. }
        ));
        assert_eq!(
            calls[1].call,
            Call::MoveMount {
                from: Obj::Tree(0, PathBuf::new()),
                to: Obj::Host(dir.path().canonicalize().expect("test setup")),
                flags,
            }
        );
        assert_eq!(calls[2].failed, Some(Errno::PERM));
        assert_eq!(r.open_trees(), vec![0]);
        drop(t);
        assert!(r.open_trees().is_empty());
    }

    #[test]
    fn a_clone_has_its_source_kind_and_a_missing_source_fails() {
        let r = Recorder::new();
        let d = r
            .open_tree(CWD, Path::new("/"), OpenTreeFlags::OPEN_TREE_CLONE)
            .expect("test setup");
        assert_eq!(
            FileType::from_raw_mode(rustix::fs::fstat(&d).expect("test setup").st_mode),
            FileType::Directory
        );
        let f = r
            .open_tree(CWD, Path::new("/dev/null"), OpenTreeFlags::OPEN_TREE_CLONE)
            .expect("test setup");
        assert_eq!(
            FileType::from_raw_mode(rustix::fs::fstat(&f).expect("test setup").st_mode),
            FileType::RegularFile
        );
        let missing = r.open_tree(
            CWD,
            Path::new("/nonexistent-sifbox-path"),
            OpenTreeFlags::OPEN_TREE_CLONE,
        );
        assert_eq!(missing.err(), Some(Errno::NOENT));
    }
}
