//! Setuid and setgid bits taken off a tree before other users can reach it
//! (the unpacked images of a shared store, see [`crate::store`]): a
//! setuid-root file that another user can execute on the host is a root
//! shell for them, whatever the sandbox does with it.
//!
//! The walk goes through fds only, at any depth ([`sifbox_sys::walk`]):
//! every directory is opened from its parent's fd with `O_NOFOLLOW`, every
//! entry is looked at with `statat(AT_SYMLINK_NOFOLLOW)` and changed through
//! an `O_PATH|O_NOFOLLOW` handle (chmod of its `/proc/self/fd` link, which
//! reaches that very inode), so a symlink in the tree never sends a chmod
//! anywhere else. Directories keep their bits: there setgid only chooses the
//! group of new entries.
//!
//! File capabilities (`security.capability`) go too: a file that host root
//! (or a sandbox whose root is host root) gave `cap_setuid+ep` is as much a
//! root shell for whoever runs it as a setuid-root one. The check is one
//! `lgetxattr` a regular file; an unprivileged caller's trees can only hold
//! capabilities bound to its own user namespace's root, which grant nothing
//! on the host, and it may not remove them, so they are left.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use sifbox_sys::walk;

/// `S_ISUID | S_ISGID`.
const SETID: u32 = 0o6000;

fn err_at(path: &Path, what: &str, e: impl Into<io::Error>) -> io::Error {
    let e = e.into();
    let msg = if what.is_empty() {
        format!("{}: {e}", path.display())
    } else {
        format!("{what} {}: {e}", path.display())
    };
    io::Error::new(e.kind(), msg)
}

/// chmod of the inode an `O_PATH` handle holds.
fn chmod_fd(fd: &OwnedFd, mode: u32) -> rustix::io::Result<()> {
    rustix::fs::chmod(
        format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()),
        Mode::from_raw_mode(mode),
    )
}

/// Takes the setuid and setgid bits off every entry below `root` that is
/// not a directory or a symlink, and the file capabilities off every
/// regular file, at any depth ([`sifbox_sys::walk`]). Returns how many
/// entries had either.
///
/// A directory of the caller that the caller cannot read or search is
/// opened up for the walk and given its mode back once the walk is done
/// with it. A file of another owner (as an unprivileged caller: one of its
/// subordinate ids) whose bits cannot be changed is an error only if the
/// bits would take effect on exec (setuid, or setgid with group execute); a
/// directory of another owner that the caller cannot read is an error only
/// if others may enter it.
pub fn strip_tree(root: &Path) -> io::Result<u64> {
    let me = rustix::process::geteuid().as_raw();
    let top = sifbox_sys::beneath::open_dir(rustix::fs::CWD, root)
        .map_err(|e| err_at(root, "opening", e))?;
    let st = rustix::fs::fstat(&top).map_err(|e| err_at(root, "opening", e))?;
    let mut v = Strip {
        root,
        me,
        stripped: 0,
        restore: HashMap::new(),
    };
    let mode = st.st_mode & 0o7777;
    if me != 0 && st.st_uid == me && mode & 0o500 != 0o500 {
        rustix::fs::fchmod(&top, Mode::from_raw_mode(mode | 0o700))
            .map_err(|e| err_at(root, "opening up", e))?;
        v.restore.insert((st.st_dev, st.st_ino), mode);
    }
    walk::walk(top.as_fd(), walk::Options::default(), &mut v)?;
    Ok(v.stripped)
}

/// [`strip_tree`]'s visitor.
struct Strip<'r> {
    root: &'r Path,
    me: u32,
    stripped: u64,
    /// Directories opened up for the walk: (device, inode) to the mode to
    /// give back when the walk leaves them.
    restore: HashMap<(u64, u64), u32>,
}

impl walk::Visitor for Strip<'_> {
    fn entry(&mut self, e: &walk::Entry<'_>) -> io::Result<walk::Step> {
        let at = |err: io::Error| err_at(&self.root.join(e.path), "", err);
        let kind = e.file_type();
        match kind {
            FileType::Directory => {
                let mode = e.stat.st_mode & 0o7777;
                if self.me != 0 && e.stat.st_uid == self.me && mode & 0o500 != 0o500 {
                    let fd = sifbox_sys::beneath::open_handle(e.dir, e.name)
                        .map_err(|err| at(err.into()))?;
                    let st = rustix::fs::fstat(&fd).map_err(|err| at(err.into()))?;
                    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                        chmod_fd(&fd, mode | 0o700).map_err(|err| at(err.into()))?;
                        self.restore.insert((st.st_dev, st.st_ino), mode);
                    }
                }
                return Ok(walk::Step::Descend);
            }
            FileType::Symlink => {}
            _ => {
                let mut had = false;
                if e.stat.st_mode & SETID != 0 {
                    had |= strip_one(e.dir, e.name, self.me).map_err(at)?;
                }
                if kind == FileType::RegularFile {
                    had |= drop_caps(e.dir, e.name, self.me).map_err(at)?;
                }
                self.stripped += u64::from(had);
            }
        }
        Ok(walk::Step::Next)
    }

    /// A directory of another owner that nobody but that owner may enter
    /// is left alone.
    fn cannot_enter(&mut self, e: &walk::Entry<'_>, err: Errno) -> io::Result<()> {
        let mode = e.stat.st_mode & 0o7777;
        match err {
            Errno::ACCESS if e.stat.st_uid != self.me && mode & 0o011 == 0 => Ok(()),
            Errno::ACCESS => Err(err_at(
                &self.root.join(e.path),
                "",
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "cannot read this directory (owner uid {}, mode {mode:04o}) to take setuid bits off what is in it, and other users may enter it",
                        e.stat.st_uid
                    ),
                ),
            )),
            err => Err(err_at(&self.root.join(e.path), "", err)),
        }
    }

    /// Gives back the mode of a directory opened up for the walk (deepest
    /// first: a parent given back a mode without search permission would
    /// hide its children).
    fn leave(&mut self, dir: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
        if self.restore.is_empty() {
            return Ok(());
        }
        let shown = self.root.join(path);
        let st =
            rustix::fs::fstat(dir).map_err(|e| err_at(&shown, "giving back the mode of", e))?;
        if let Some(mode) = self.restore.remove(&(st.st_dev, st.st_ino)) {
            rustix::fs::fchmod(dir, Mode::from_raw_mode(mode))
                .map_err(|e| err_at(&shown, "giving back the mode of", e))?;
        }
        Ok(())
    }

    fn error(&mut self, path: &Path, err: io::Error) -> io::Result<()> {
        Err(err_at(&self.root.join(path), "", err))
    }
}

/// The record, at a shared tree's root, of the modes [`close_writes`]
/// took group and world write off: JSON `[[path, mode, is_dir], ...]`,
/// paths relative. The engine re-creates those directories with their
/// modes in each sandbox's own upper layer (so `/tmp` is 1777 inside).
pub const MODES_RECORD: &str = ".sifbox-modes";

/// Takes group and world write off every directory and file below `root`
/// (not symlinks), at any depth, and writes what it changed to
/// [`MODES_RECORD`] at the root: a shared store's tree is read by its
/// group, and a world-writable `/tmp` there let a member plant a file that
/// the owner's sandbox then ran. Returns how many entries changed.
pub fn close_writes(root: &Path) -> io::Result<u64> {
    struct Close<'r> {
        root: &'r Path,
        changed: Vec<(String, u32, bool)>,
    }
    impl walk::Visitor for Close<'_> {
        fn entry(&mut self, e: &walk::Entry<'_>) -> io::Result<walk::Step> {
            let kind = e.file_type();
            let mode = e.stat.st_mode & 0o7777;
            let dir = kind == FileType::Directory;
            if matches!(kind, FileType::Directory | FileType::RegularFile) && mode & 0o022 != 0 {
                let at = |err: io::Error| err_at(&self.root.join(e.path), "", err);
                let fd = sifbox_sys::beneath::open_handle(e.dir, e.name)
                    .map_err(|err| at(err.into()))?;
                let st = rustix::fs::fstat(&fd).map_err(|err| at(err.into()))?;
                if FileType::from_raw_mode(st.st_mode) == kind {
                    chmod_fd(&fd, mode & !0o022).map_err(|err| at(err.into()))?;
                    // A name that is not UTF-8 stays closed inside too.
                    if let Some(p) = e.path.to_str() {
                        self.changed.push((p.to_string(), mode, dir));
                    }
                }
            }
            Ok(if dir {
                walk::Step::Descend
            } else {
                walk::Step::Next
            })
        }
        fn error(&mut self, path: &Path, err: io::Error) -> io::Result<()> {
            Err(err_at(&self.root.join(path), "", err))
        }
    }
    let top = sifbox_sys::beneath::open_dir(rustix::fs::CWD, root)
        .map_err(|e| err_at(root, "opening", e))?;
    let mut v = Close {
        root,
        changed: Vec::new(),
    };
    let st = rustix::fs::fstat(&top).map_err(|e| err_at(root, "opening", e))?;
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        rustix::fs::fchmod(&top, Mode::from_raw_mode(mode & !0o022))
            .map_err(|e| err_at(root, "closing", e))?;
        v.changed.push((String::new(), mode, true));
    }
    walk::walk(top.as_fd(), walk::Options::default(), &mut v)?;
    // The image's own file of that name (if any) gives way to ours.
    match rustix::fs::unlinkat(&top, MODES_RECORD, rustix::fs::AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(err_at(&root.join(MODES_RECORD), "replacing", e)),
    }
    let json = serde_json::to_vec(&v.changed).map_err(io::Error::other)?;
    let fd = rustix::fs::openat(
        &top,
        MODES_RECORD,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| err_at(&root.join(MODES_RECORD), "creating", e))?;
    let mut f = std::fs::File::from(fd);
    std::io::Write::write_all(&mut f, &json)
        .map_err(|e| err_at(&root.join(MODES_RECORD), "writing", e))?;
    Ok(v.changed.len() as u64)
}

/// `security.capability`: the xattr of file capabilities.
const CAPS: &str = "security.capability";

/// Takes the file capabilities off the regular file `name` in `dir`;
/// whether it had them.
fn drop_caps(dir: BorrowedFd<'_>, name: &CStr, me: u32) -> io::Result<bool> {
    // The name under the directory's own fd link: lgetxattr follows the
    // link to that directory and not a symlink the name might be.
    let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .join(OsStr::from_bytes(name.to_bytes()));
    let mut probe = [0u8; 0];
    match rustix::fs::lgetxattr(&at, CAPS, &mut probe) {
        Ok(_) | Err(Errno::RANGE) => {}
        Err(Errno::NODATA | Errno::NOTSUP) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    let fd = sifbox_sys::beneath::open_handle(dir, name)?;
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        return Ok(false);
    }
    match rustix::fs::removexattr(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()), CAPS) {
        Ok(()) => Ok(true),
        Err(Errno::NODATA) => Ok(false),
        // Only host root's capabilities hold on the host (see the module).
        Err(Errno::PERM) if me != 0 => Ok(false),
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("cannot take its file capabilities off: {e}"),
        )),
    }
}

/// Takes the bits off `name` in `dir`; whether it had them.
fn strip_one(dir: BorrowedFd<'_>, name: &CStr, me: u32) -> io::Result<bool> {
    let fd = sifbox_sys::beneath::open_handle(dir, name)?;
    let st = rustix::fs::fstat(&fd)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    let mode = st.st_mode & 0o7777;
    if matches!(kind, FileType::Directory | FileType::Symlink) || mode & SETID == 0 {
        return Ok(false);
    }
    match chmod_fd(&fd, mode & !SETID) {
        Ok(()) => Ok(true),
        // chown cleared what matters on exec; a setgid bit without group
        // execute is only a locking hint.
        Err(Errno::PERM)
            if st.st_uid != me
                && !(kind == FileType::RegularFile
                    && (mode & 0o4000 != 0 || mode & 0o2010 == 0o2010)) =>
        {
            Ok(false)
        }
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "cannot take the setuid/setgid bits off it (owner uid {}, mode {mode:04o}): {e}",
                st.st_uid
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    fn set(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    }

    #[test]
    fn strips_files_keeps_dirs_and_never_follows_links() {
        let t = tempfile::tempdir().expect("tempdir");
        let tree = t.path().join("tree");
        let outside = t.path().join("outside-suid");
        std::fs::write(&outside, b"decoy").expect("write");
        set(&outside, 0o4755);
        std::fs::create_dir_all(tree.join("usr/bin")).expect("mkdir");
        std::fs::create_dir(tree.join("shared")).expect("mkdir");
        set(&tree.join("shared"), 0o2775);
        for (name, m) in [
            ("suid", 0o4755),
            ("sgid", 0o2755),
            ("both", 0o6711),
            ("plain", 0o755),
        ] {
            let p = tree.join("usr/bin").join(name);
            std::fs::write(&p, b"#!/bin/sh\n").expect("write");
            set(&p, m);
        }
        std::os::unix::fs::symlink(&outside, tree.join("usr/bin/link")).expect("symlink");
        // A directory of the caller it cannot read or search.
        let locked = tree.join("locked");
        std::fs::create_dir(&locked).expect("mkdir");
        std::fs::write(locked.join("inner"), b"x").expect("write");
        set(&locked.join("inner"), 0o4700);
        set(&locked, 0o100);

        let n = strip_tree(&tree).expect("strip");
        assert_eq!(n, 4);
        assert_eq!(mode(&tree.join("usr/bin/suid")), 0o755);
        assert_eq!(mode(&tree.join("usr/bin/sgid")), 0o755);
        assert_eq!(mode(&tree.join("usr/bin/both")), 0o711);
        assert_eq!(mode(&tree.join("usr/bin/plain")), 0o755);
        assert_eq!(
            mode(&tree.join("shared")),
            0o2775,
            "directories keep setgid"
        );
        assert_eq!(mode(&outside), 0o4755, "a symlink is never followed");
        assert_eq!(mode(&locked), 0o100, "its mode is given back");
        set(&locked, 0o700);
        assert_eq!(mode(&locked.join("inner")), 0o700);
        // Nothing left: a second pass finds nothing.
        assert_eq!(strip_tree(&tree).expect("strip"), 0);
    }

    /// A file capability (cap_setuid+ep) goes, where the caller could set
    /// one (host root); a symlink to a capable file outside is not
    /// followed.
    #[test]
    fn file_capabilities_go_too() {
        let t = tempfile::tempdir().expect("tempdir");
        let tree = t.path().join("tree");
        std::fs::create_dir(&tree).expect("mkdir");
        let outside = t.path().join("outside");
        // VFS_CAP_REVISION_2 with the effective bit, permitted CAP_SETUID.
        let caps: [u8; 20] = [
            1, 0, 0, 2, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let set_caps = |p: &Path| {
            std::fs::write(p, b"x").expect("write");
            rustix::fs::setxattr(p, CAPS, &caps, rustix::fs::XattrFlags::empty()).is_ok()
        };
        if !set_caps(&tree.join("capped")) || !set_caps(&outside) {
            // Not permitted here (an unprivileged caller): nothing to test.
            return;
        }
        std::os::unix::fs::symlink(&outside, tree.join("link")).expect("symlink");
        assert_eq!(strip_tree(&tree).expect("strip"), 1);
        let mut buf = [0u8; 64];
        assert!(rustix::fs::getxattr(tree.join("capped"), CAPS, &mut buf).is_err());
        assert!(
            rustix::fs::getxattr(&outside, CAPS, &mut buf).is_ok(),
            "followed"
        );
        assert_eq!(strip_tree(&tree).expect("strip"), 0);
    }

    /// A setuid file 300 levels down, below names that make its path far
    /// longer than PATH_MAX, loses its bit; so does one in an unreadable
    /// directory of the caller's that deep, which gets its mode back.
    #[test]
    fn a_setuid_file_at_any_depth_is_stripped() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = |p: &Path| {
            rustix::fs::open(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).expect("open")
        };
        let mut fd = dir(t.path());
        let long = "l".repeat(100);
        for _ in 0..300 {
            rustix::fs::mkdirat(&fd, long.as_str(), Mode::from_raw_mode(0o755)).expect("mkdir");
            fd = rustix::fs::openat(
                &fd,
                long.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            )
            .expect("open");
        }
        let file = |fd: &OwnedFd, name: &str| {
            let f = rustix::fs::openat(
                fd,
                name,
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o755),
            )
            .expect("create");
            rustix::fs::fchmod(&f, Mode::from_raw_mode(0o4755)).expect("chmod");
            f
        };
        let suid = file(&fd, "suid");
        rustix::fs::mkdirat(&fd, "locked", Mode::from_raw_mode(0o700)).expect("mkdir");
        let locked = rustix::fs::openat(
            &fd,
            "locked",
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .expect("open");
        let inner = file(&locked, "inner");
        rustix::fs::fchmod(&locked, Mode::from_raw_mode(0o100)).expect("chmod");
        assert_eq!(strip_tree(t.path()).expect("strip"), 2);
        let mode = |f: &OwnedFd| rustix::fs::fstat(f).expect("stat").st_mode & 0o7777;
        assert_eq!(mode(&suid), 0o755);
        assert_eq!(mode(&inner), 0o755);
        assert_eq!(mode(&locked), 0o100, "its mode is given back");
    }

    /// Group and world write go off dirs and files, the modes recorded;
    /// a symlink is not followed.
    #[test]
    fn writes_are_closed_and_recorded() {
        let t = tempfile::tempdir().expect("tempdir");
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("tmp")).expect("mkdir");
        std::fs::create_dir_all(tree.join("var/tmp")).expect("mkdir");
        set(&tree.join("tmp"), 0o1777);
        set(&tree.join("var/tmp"), 0o1777);
        std::fs::write(tree.join("open"), "x").expect("write");
        set(&tree.join("open"), 0o666);
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        set(&outside, 0o777);
        std::os::unix::fs::symlink(&outside, tree.join("link")).expect("symlink");
        assert_eq!(close_writes(&tree).expect("close"), 3);
        assert_eq!(mode(&tree.join("tmp")), 0o1755);
        assert_eq!(mode(&tree.join("var/tmp")), 0o1755);
        assert_eq!(mode(&tree.join("open")), 0o644);
        assert_eq!(mode(&outside), 0o777, "followed");
        let rec: Vec<(String, u32, bool)> =
            serde_json::from_slice(&std::fs::read(tree.join(MODES_RECORD)).expect("read"))
                .expect("json");
        let mut rec = rec;
        rec.sort();
        assert_eq!(
            rec,
            [
                ("open".to_string(), 0o666, false),
                ("tmp".to_string(), 0o1777, true),
                ("var/tmp".to_string(), 0o1777, true)
            ]
        );
    }

    #[test]
    fn a_symlinked_root_is_refused() {
        let t = tempfile::tempdir().expect("tempdir");
        let real = t.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        std::fs::write(real.join("f"), b"x").expect("write");
        set(&real.join("f"), 0o4755);
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        assert!(strip_tree(&link).is_err());
        assert_eq!(mode(&real.join("f")), 0o4755);
    }
}
