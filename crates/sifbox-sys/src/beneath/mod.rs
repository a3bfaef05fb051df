//! The fd-relative file-system layer: how sifbox touches, on the host, a
//! tree that a sandbox, a task or a build could have written or could be
//! changing meanwhile (bind sources, task files, the runtime dir, `cp`
//! in both directions, logs and rollout dirs, build contexts, unpacked
//! layers). No `unsafe` here: it lives in this crate because every other
//! crate depends on it.
//!
//! The rules, each kept by one function below:
//!
//! - A name is resolved once, from a directory fd, and what is used is
//!   the fd it gave: never the path again.
//! - One name at a time ([`open_handle`], [`open_dir`], [`open_subdir`], [`reach_dir`],
//!   [`walk`]): `openat(O_NOFOLLOW)`, so a symlink is never followed; a
//!   component that is not a real directory ends the lookup.
//! - A path of several names ([`open_beneath`]): `openat2` with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: no
//!   `..` above the base, no absolute path, no symlink anywhere on the
//!   way (`ELOOP`, `EXDEV`). [`open_inside`] relaxes it for task files
//!   (symlinks followed while they stay beneath the base), and
//!   [`open_in_root`] resolves a path in a sandbox's tree as its processes
//!   will (the tree as `/`).
//! - Reading a file ([`open_regular`]): `O_NONBLOCK | O_NOCTTY`, so a
//!   fifo or a device put in its place does not block or take a
//!   terminal, then refused unless `fstat` shows a regular file; the
//!   caller sees its link count (a hard link to a file elsewhere is one
//!   more link).
//! - Writing a file ([`create_new`]): what is at the name (a symlink, a
//!   hard link to something else) is unlinked, not followed, and the file
//!   is made `O_CREAT | O_EXCL | O_NOFOLLOW`: ours, in that directory.
//! - A directory of the caller's alone ([`private_dir`]): checked by its
//!   fd (owner, mode, not a symlink).
//! - A whole tree ([`walk`]): directory fds of any depth, checked
//!   against `..` when a parent is reopened, on one file system if asked.
//!
//! Why not cap-std, which four crates already use to write into trees of
//! their own making: cap-std resolves symlinks (keeping them beneath its
//! `Dir`) where these callers must refuse them, and it offers no `O_PATH`
//! handles (needed to name a directory to `mount`/`fchownat` without
//! opening it for reading), no `RESOLVE_NO_SYMLINKS`, no depth-unbounded
//! walk with a bounded number of fds, and no owner or link-count checks.
//! Those are the decisions a review of the host side needs in one place,
//! so they are here, each in a function small enough to read whole.

pub mod private_dir;
pub mod walk;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

pub use private_dir::{check_ancestors, fd_path, private_dir, NotPrivate};
pub use walk::walk;

/// A directory opened for reading its entries, not followed.
pub const DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// A directory opened only as a handle (`O_PATH`), not followed.
pub const DIR_PATH: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// How [`open_beneath`] resolves: beneath the base, no symlink at all.
pub const STRICT: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// How [`open_inside`] resolves: beneath the base, symlinks followed while
/// they stay beneath it (an absolute one, or one whose `..` leaves, is
/// `EXDEV`), no magic links.
pub const INSIDE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// How [`open_in_root`] resolves: as if the base were `/`.
pub const IN_ROOT: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// How often `openat2` is tried again when the kernel asks (`EAGAIN`: a
/// rename raced the lookup).
const RETRIES: usize = 8;

fn openat2_retrying(
    base: impl AsFd,
    path: &Path,
    flags: OFlags,
    how: ResolveFlags,
) -> rustix::io::Result<OwnedFd> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(
            base.as_fd(),
            path,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            how,
        ) {
            Err(Errno::AGAIN) if tries < RETRIES => tries += 1,
            r => return r,
        }
    }
}

/// `openat2(base, path, flags | O_CLOEXEC, `[`STRICT`]`)`: exactly that path
/// below `base` (empty: `base` itself), following nothing. A symlink
/// anywhere is `ELOOP` (the last component too, unless `flags` has
/// `O_PATH | O_NOFOLLOW`, which opens the link itself); `..` above `base`
/// or an absolute path is `EXDEV`.
pub fn open_beneath(
    base: impl AsFd,
    path: impl AsRef<Path>,
    flags: OFlags,
) -> rustix::io::Result<OwnedFd> {
    openat2_retrying(base, path.as_ref(), flags, STRICT)
}

/// `openat2(base, path, flags | O_CLOEXEC, `[`INSIDE`]`)`: `path` below
/// `base`, symlinks followed while they stay beneath it. For a task's own
/// files, whose links point within the task.
pub fn open_inside(
    base: impl AsFd,
    path: impl AsRef<Path>,
    flags: OFlags,
) -> rustix::io::Result<OwnedFd> {
    openat2_retrying(base, path.as_ref(), flags, INSIDE)
}

/// `openat2(root, path, flags | O_CLOEXEC, RESOLVE_IN_ROOT |
/// RESOLVE_NO_MAGICLINKS)`: `path` looked up as if `root` were `/` (a
/// sandbox's own tree, as its processes will see it): an absolute symlink
/// starts again at `root`, `..` stops there.
pub fn open_in_root(
    root: impl AsFd,
    path: impl AsRef<Path>,
    flags: OFlags,
) -> rustix::io::Result<OwnedFd> {
    openat2_retrying(root, path.as_ref(), flags, IN_ROOT)
}

/// The directory `name` in `dir` (or the path `name` from the working
/// directory with `rustix::fs::CWD`, its parents followed), opened for
/// reading its entries; a symlink at `name` is `ENOTDIR`/`ELOOP`.
pub fn open_dir(dir: impl AsFd, name: impl rustix::path::Arg) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(dir, name, DIR, Mode::empty())
}

/// An `O_PATH` handle of the entry `name` of `dir` itself, whatever it is
/// (a symlink is not followed: the handle is the link): what is looked
/// at (`fstat`) and changed through it is that very inode.
pub fn open_handle(dir: impl AsFd, name: impl rustix::path::Arg) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// [`open_dir`] as an `O_PATH` handle.
pub fn open_dir_path(dir: impl AsFd, name: impl rustix::path::Arg) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(dir, name, DIR_PATH, Mode::empty())
}

/// Makes the directory `name` in `dir` unless something is there (not
/// followed): whether it made it.
pub fn make_dir(dir: impl AsFd, name: impl rustix::path::Arg, mode: Mode) -> io::Result<bool> {
    match rustix::fs::mkdirat(dir, name, mode) {
        Ok(()) => Ok(true),
        Err(Errno::EXIST) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What a name that should be a directory is, when it is not (callers
/// name the path).
pub fn not_a_dir(e: Errno) -> io::Error {
    match e {
        Errno::NOTDIR | Errno::LOOP => {
            io::Error::other("not a directory (a symlink or a file is there; it is not followed)")
        }
        e => e.into(),
    }
}

/// The directory `rel` below `root` as an `O_PATH` handle, reached one
/// component at a time without following any symlink (one there is an
/// error, never a way out; `..`, `.` and an absolute `rel` are refused).
/// With `made`, missing components are made (mode 0755) and their paths
/// pushed onto it. Errors name the component.
pub fn reach_dir(
    root: impl AsFd,
    rel: &Path,
    mut made: Option<&mut Vec<PathBuf>>,
) -> io::Result<OwnedFd> {
    let root = root.as_fd();
    let mut cur: Option<OwnedFd> = None;
    let mut so_far = PathBuf::new();
    for c in rel.components() {
        let Component::Normal(n) = c else {
            return Err(io::Error::other(format!("bad path {}", rel.display())));
        };
        so_far.push(n);
        let base = cur.as_ref().map_or(root, AsFd::as_fd);
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", so_far.display()));
        if let Some(made) = made.as_deref_mut() {
            if make_dir(base, n, Mode::from_raw_mode(0o755)).map_err(named)? {
                made.push(so_far.clone());
            }
        }
        cur = Some(open_subdir(base, n).map_err(named)?);
    }
    match cur {
        Some(fd) => Ok(fd),
        None => rustix::fs::openat(root, ".", DIR_PATH, Mode::empty()).map_err(Into::into),
    }
}

/// The directory `name` in `dir` as an `O_PATH` handle, not followed, and
/// checked by its fd to be a directory; errors say what is there instead
/// (callers name the path).
pub fn open_subdir(dir: impl AsFd, name: impl rustix::path::Arg) -> io::Result<OwnedFd> {
    let fd = open_dir_path(dir, name).map_err(not_a_dir)?;
    is_dir(&fd)?;
    Ok(fd)
}

/// Whether the open `fd` is a directory (an error saying it is not).
pub fn is_dir(fd: impl AsFd) -> io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        Ok(())
    } else {
        Err(not_a_dir(Errno::NOTDIR))
    }
}

/// The names in the directory `dir`, sorted, without `.` and `..`. A
/// readable fd is read as it is (a directory removed meanwhile has no
/// names); an `O_PATH` one is opened again as `.` for reading.
pub fn names(dir: impl AsFd) -> io::Result<Vec<OsString>> {
    let dir = dir.as_fd();
    let fd = if rustix::fs::fcntl_getfl(dir)?.contains(OFlags::PATH) {
        rustix::fs::openat(
            dir,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?
    } else {
        dir.try_clone_to_owned()?
    };
    let mut entries = rustix::fs::Dir::new(fd)?;
    entries.rewind();
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_os_string());
        }
    }
    out.sort();
    Ok(out)
}

/// Opens `name` in `dir` for reading when it is a regular file: not
/// followed (`O_NOFOLLOW`), non-blocking and no controlling terminal (a
/// fifo or a device put there does neither block nor attach), and refused
/// (`ErrorKind::InvalidInput`) unless `fstat` of what opened shows a
/// regular file. Returns its status too: `st_nlink` above 1 is a hard link
/// (perhaps to a file outside the tree), for callers that refuse those.
pub fn open_regular(dir: impl AsFd, name: impl rustix::path::Arg) -> io::Result<(File, Stat)> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok((File::from(fd), st))
}

/// A fresh, empty file `name` in `dir` (mode `mode`), for writing: what is
/// there (a file, a symlink, a hard link to a file elsewhere; not
/// followed) is unlinked first, and the file is made with
/// `O_CREAT | O_EXCL | O_NOFOLLOW`, so it is ours and in `dir`, or an
/// error. A directory there is an error.
pub fn create_new(
    dir: impl AsFd,
    name: impl rustix::path::Arg + Copy,
    mode: Mode,
) -> io::Result<File> {
    let dir = dir.as_fd();
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )?;
    Ok(File::from(fd))
}

/// Makes room for a new non-directory `name` in `dir`: whatever
/// non-directory is there (a symlink above all) is removed, not followed;
/// a directory is an error.
pub fn clear(dir: impl AsFd, name: impl rustix::path::Arg + Copy) -> io::Result<()> {
    let dir = dir.as_fd();
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            Err(io::Error::other("a directory is in the way"))
        }
        // Not AT_REMOVEDIR: should a directory be there by now, this fails.
        Ok(_) => Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?),
    }
}

#[cfg(test)]
mod tests;
