//! Setuid and setgid bits taken off a tree before other users can reach it
//! (the unpacked images of a shared store, see [`crate::store`]): a
//! setuid-root file that another user can execute on the host is a root
//! shell for them, whatever the sandbox does with it.
//!
//! The walk goes through fds only: every directory is opened beneath the
//! tree's root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, every
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

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

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

/// Opens directory `rel` (empty: the root itself) beneath `top`, refusing
/// symlinks anywhere on the way.
fn open_beneath(top: &OwnedFd, rel: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    rustix::fs::openat2(
        top,
        rel,
        flags | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
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
/// regular file. Returns how many entries had either.
///
/// A directory of the caller that the caller cannot read or search is
/// opened up for the walk and given its mode back afterwards. A file of
/// another owner (as an unprivileged caller: one of its subordinate ids)
/// whose bits cannot be changed is an error only if the bits would take
/// effect on exec (setuid, or setgid with group execute); a directory of
/// another owner that the caller cannot read is an error only if others
/// may enter it.
pub fn strip_tree(root: &Path) -> io::Result<u64> {
    let me = rustix::process::geteuid().as_raw();
    let top = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err_at(root, "opening", e))?;
    let mut stack = vec![PathBuf::new()];
    let mut restore: Vec<(PathBuf, u32)> = Vec::new();
    let mut stripped = 0;
    while let Some(rel) = stack.pop() {
        let shown = root.join(&rel);
        let Some(dir) =
            open_dir(&top, &rel, me, &mut restore).map_err(|e| err_at(&shown, "", e))?
        else {
            continue;
        };
        let mut rd = rustix::fs::Dir::read_from(&dir).map_err(|e| err_at(&shown, "reading", e))?;
        while let Some(entry) = rd.read() {
            let entry = entry.map_err(|e| err_at(&shown, "reading", e))?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let child = rel.join(OsStr::from_bytes(name.to_bytes()));
            let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| err_at(&root.join(&child), "looking at", e))?;
            let kind = FileType::from_raw_mode(st.st_mode);
            match kind {
                FileType::Directory => stack.push(child),
                FileType::Symlink => {}
                _ => {
                    let mut had = false;
                    if st.st_mode & SETID != 0 {
                        had |= strip_one(&dir, name, me)
                            .map_err(|e| err_at(&root.join(&child), "", e))?;
                    }
                    if kind == FileType::RegularFile {
                        had |= drop_caps(&dir, name, me)
                            .map_err(|e| err_at(&root.join(&child), "", e))?;
                    }
                    stripped += u64::from(had);
                }
            }
        }
    }
    // Deepest first: a parent given back a mode without search permission
    // would hide its children.
    for (rel, mode) in restore.into_iter().rev() {
        open_beneath(&top, &rel, OFlags::PATH)
            .and_then(|fd| chmod_fd(&fd, mode))
            .map_err(|e| err_at(&root.join(&rel), "giving back the mode of", e))?;
    }
    Ok(stripped)
}

/// Opens directory `rel` for reading; `None`: a directory of another owner
/// that nobody but that owner may enter, left alone.
fn open_dir(
    top: &OwnedFd,
    rel: &Path,
    me: u32,
    restore: &mut Vec<(PathBuf, u32)>,
) -> io::Result<Option<OwnedFd>> {
    let handle = open_beneath(top, rel, OFlags::PATH)?;
    let st = rustix::fs::fstat(&handle)?;
    let mode = st.st_mode & 0o7777;
    if me != 0 && st.st_uid == me && mode & 0o500 != 0o500 {
        chmod_fd(&handle, mode | 0o700)?;
        restore.push((rel.to_path_buf(), mode));
    }
    match open_beneath(top, rel, OFlags::RDONLY) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ACCESS) if st.st_uid != me && mode & 0o011 == 0 => Ok(None),
        Err(Errno::ACCESS) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "cannot read this directory (owner uid {}, mode {mode:04o}) to take setuid bits off what is in it, and other users may enter it",
                st.st_uid
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// `security.capability`: the xattr of file capabilities.
const CAPS: &str = "security.capability";

/// Takes the file capabilities off the regular file `name` in `dir`;
/// whether it had them.
fn drop_caps(dir: &OwnedFd, name: &CStr, me: u32) -> io::Result<bool> {
    // The name under the directory's own fd link: lgetxattr follows the
    // link to that directory and not a symlink the name might be.
    let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd()))
        .join(OsStr::from_bytes(name.to_bytes()));
    let mut probe = [0u8; 0];
    match rustix::fs::lgetxattr(&at, CAPS, &mut probe) {
        Ok(_) | Err(Errno::RANGE) => {}
        Err(Errno::NODATA | Errno::NOTSUP) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    let fd = open_entry(dir, name)?;
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

/// An `O_PATH` handle of the entry `name` of `dir` itself (a symlink is
/// not followed): what is changed through it is the inode looked at.
fn open_entry(dir: &OwnedFd, name: &CStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Takes the bits off `name` in `dir`; whether it had them.
fn strip_one(dir: &OwnedFd, name: &CStr, me: u32) -> io::Result<bool> {
    let fd = open_entry(dir, name)?;
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
