//! A tree walk through directory fds, of any depth (no `unsafe`): what
//! give-back (`sifbox_engine::transfer::give_back`) and the setid strip
//! (`sifbox_image::setid::strip_tree`) walk trees that a sandbox filled
//! with.
//!
//! Every entry is looked at with `statat(AT_SYMLINK_NOFOLLOW)` relative to
//! its directory's fd, and a directory is entered with
//! `openat(O_NOFOLLOW | O_DIRECTORY)` relative to its parent's: no symlink
//! is ever followed, and no path longer than one name is ever resolved, so
//! the depth of the tree is bounded by nothing but memory (a sandbox can
//! make a chain of thousands of directories; `PATH_MAX` is no limit for
//! it). The walk is iterative: one frame per level (the names of the
//! subdirectories left to enter), and an open fd for the first
//! [`KEPT_FDS`] levels and the current one only. Deeper, a parent is
//! reopened as `..` of the child just left and must be the very directory
//! (device and inode) it was: a tree changed under the walk (a directory
//! moved elsewhere) ends it with an error rather than leading it outside.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

/// Levels whose directory fds stay open while the walk is below them;
/// deeper parents are reopened through `..` (checked) when the walk comes
/// back up. Bounds the walk's fds whatever the depth.
pub const KEPT_FDS: usize = 32;

/// What the walk does after an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on with the next entry (a directory is not entered).
    Next,
    /// Enter this directory (ignored for anything else), once the entries
    /// of its parent have all been seen.
    Descend,
    /// End the walk now, successfully.
    Stop,
}

/// One entry of a directory, as the walk hands it to a [`Visitor`].
#[derive(Debug)]
pub struct Entry<'a> {
    /// The directory it is in.
    pub dir: BorrowedFd<'a>,
    /// Its name there.
    pub name: &'a CStr,
    /// Its own metadata (not followed).
    pub stat: &'a Stat,
    /// Its path below the walk's top (for messages only: never resolved).
    pub path: &'a Path,
    /// 1 for the top's entries.
    pub depth: usize,
}

impl Entry<'_> {
    pub fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }
}

/// What a walk does at each entry. Errors the walk meets go to
/// [`Visitor::error`], which may go on (`Ok`) or end the walk (`Err`).
pub trait Visitor {
    /// An entry (never `.` or `..`).
    fn entry(&mut self, e: &Entry<'_>) -> io::Result<Step>;

    /// A directory asked for ([`Step::Descend`]) could not be opened: by
    /// default an error, as any other.
    fn cannot_enter(&mut self, e: &Entry<'_>, err: Errno) -> io::Result<()> {
        self.error(e.path, err.into())
    }

    /// The walk is done with the directory at `path` (its fd: `dir`;
    /// deepest first, the top last).
    fn leave(&mut self, _dir: BorrowedFd<'_>, _path: &Path) -> io::Result<()> {
        Ok(())
    }

    /// What failed at `path` (below the top): by default, the walk's error.
    fn error(&mut self, path: &Path, err: io::Error) -> io::Result<()> {
        Err(with_path(path, err))
    }
}

/// How a walk goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Directories on another file system than the top's are not entered
    /// (checked on the opened fd: a mount made meanwhile is seen).
    pub one_file_system: bool,
}

fn with_path(path: &Path, err: io::Error) -> io::Error {
    if path.as_os_str().is_empty() {
        return err;
    }
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}

/// A level of the walk.
struct Frame {
    /// Open while the walk is at this level or the level is among the
    /// first [`KEPT_FDS`].
    fd: Option<OwnedFd>,
    dev: u64,
    ino: u64,
    /// Subdirectories still to enter, with their metadata, last first.
    pending: Vec<(CString, Stat)>,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Walks the tree below the directory `top` (not `top` itself: the
/// visitor's [`Visitor::leave`] gets it last), entering what the visitor
/// asks for. Returns early with `Ok` on [`Step::Stop`].
pub fn walk(top: BorrowedFd<'_>, opts: Options, visitor: &mut impl Visitor) -> io::Result<()> {
    let top = rustix::fs::openat(top, c".", DIR_FLAGS, Mode::empty())?;
    let st = rustix::fs::fstat(&top)?;
    let dev = st.st_dev;
    let mut path = PathBuf::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut frame = Frame {
        fd: Some(top),
        dev: st.st_dev,
        ino: st.st_ino,
        pending: Vec::new(),
    };
    if read_level(&mut frame, &path, stack.len() + 1, visitor)? {
        return Ok(());
    }
    stack.push(frame);
    loop {
        let depth = stack.len();
        let Some(cur) = stack.last_mut() else {
            return Ok(());
        };
        let Some((name, st)) = cur.pending.pop() else {
            // Done here: back to the parent, then leave this one.
            let done = stack.pop().and_then(|f| f.fd);
            let Some(done) = done else {
                return Err(io::Error::other("the walk lost a directory's fd"));
            };
            if let Some(parent) = stack.last_mut() {
                if parent.fd.is_none() {
                    match reopen_parent(&done, parent) {
                        Ok(fd) => parent.fd = Some(fd),
                        Err(e) => return Err(with_path(&path, e)),
                    }
                }
            }
            visitor.leave(done.as_fd(), &path)?;
            path.pop();
            continue;
        };
        let Some(cur_fd) = cur.fd.as_ref() else {
            return Err(io::Error::other("the walk lost a directory's fd"));
        };
        let child_path = path.join(OsStr::from_bytes(name.to_bytes()));
        let sub = match rustix::fs::openat(cur_fd, &name, DIR_FLAGS, Mode::empty()) {
            Ok(sub) => sub,
            // Replaced by a symlink or something else since it was seen.
            Err(Errno::LOOP | Errno::NOTDIR) => continue,
            Err(err) => {
                let e = Entry {
                    dir: cur_fd.as_fd(),
                    name: &name,
                    stat: &st,
                    path: &child_path,
                    depth,
                };
                visitor.cannot_enter(&e, err)?;
                continue;
            }
        };
        let sst = match rustix::fs::fstat(&sub) {
            Ok(sst) => sst,
            Err(err) => {
                visitor.error(&child_path, err.into())?;
                continue;
            }
        };
        if opts.one_file_system && sst.st_dev != dev {
            continue;
        }
        // Only the first levels and the current one keep their fds.
        if depth > KEPT_FDS {
            cur.fd = None;
        }
        path = child_path;
        let mut next = Frame {
            fd: Some(sub),
            dev: sst.st_dev,
            ino: sst.st_ino,
            pending: Vec::new(),
        };
        if read_level(&mut next, &path, depth + 1, visitor)? {
            return Ok(());
        }
        stack.push(next);
    }
}

/// Reads the entries of `frame`'s directory (at `path`, its entries at
/// `depth`), handing each to the visitor and keeping the subdirectories it
/// asks for. Whether the visitor said [`Step::Stop`].
fn read_level(
    frame: &mut Frame,
    path: &Path,
    depth: usize,
    visitor: &mut impl Visitor,
) -> io::Result<bool> {
    let Some(fd) = frame.fd.as_ref() else {
        return Err(io::Error::other("the walk lost a directory's fd"));
    };
    let rd = match rustix::fs::Dir::read_from(fd) {
        Ok(rd) => rd,
        Err(err) => {
            visitor.error(path, err.into())?;
            return Ok(false);
        }
    };
    for entry in rd {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => {
                visitor.error(path, err.into())?;
                break;
            }
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let child = path.join(OsStr::from_bytes(name.to_bytes()));
        let st = match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(err) => {
                visitor.error(&child, err.into())?;
                continue;
            }
        };
        let e = Entry {
            dir: fd.as_fd(),
            name,
            stat: &st,
            path: &child,
            depth,
        };
        match visitor.entry(&e)? {
            Step::Next => {}
            Step::Stop => return Ok(true),
            Step::Descend => {
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    frame.pending.push((name.to_owned(), st));
                }
            }
        }
    }
    // Entered in the order read.
    frame.pending.reverse();
    Ok(false)
}

/// `..` of `child`, which must be the directory `parent` recorded.
fn reopen_parent(child: &OwnedFd, parent: &Frame) -> io::Result<OwnedFd> {
    let fd = rustix::fs::openat(child, c"..", DIR_FLAGS, Mode::empty())?;
    let st = rustix::fs::fstat(&fd)?;
    if st.st_dev != parent.dev || st.st_ino != parent.ino {
        return Err(io::Error::other(
            "the tree changed during the walk (a directory was moved): its parent is no longer the one entered",
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts entries, enters every directory, records leaves.
    #[derive(Default)]
    struct Count {
        files: usize,
        dirs: usize,
        deepest: usize,
        left: Vec<PathBuf>,
        /// Where to count this process's fds into (other tests' fds are
        /// elsewhere).
        tree: Option<PathBuf>,
        most_fds: usize,
    }

    /// This process's fds open in `tree` (or too deep for their path to
    /// be shown: only the walk's are).
    fn fds_in(tree: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .expect("fds")
            .flatten()
            .filter(|e| match std::fs::read_link(e.path()) {
                Ok(p) => p.starts_with(tree),
                Err(e) => e.raw_os_error() == Some(Errno::NAMETOOLONG.raw_os_error()),
            })
            .count()
    }

    impl Visitor for Count {
        fn entry(&mut self, e: &Entry<'_>) -> io::Result<Step> {
            self.deepest = self.deepest.max(e.depth);
            if let Some(tree) = &self.tree {
                self.most_fds = self.most_fds.max(fds_in(tree));
            }
            Ok(match e.file_type() {
                FileType::Directory => {
                    self.dirs += 1;
                    Step::Descend
                }
                _ => {
                    self.files += 1;
                    Step::Next
                }
            })
        }

        fn leave(&mut self, _dir: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
            self.left.push(path.to_path_buf());
            Ok(())
        }
    }

    fn open(p: &Path) -> OwnedFd {
        rustix::fs::open(p, DIR_FLAGS, Mode::empty()).expect("open")
    }

    /// A chain far deeper than `PATH_MAX` allows by path, with long names:
    /// every level is entered, with a bounded number of fds.
    #[test]
    fn any_depth_and_bounded_fds() {
        let t = tempfile::tempdir().expect("tempdir");
        let name = "d".repeat(200);
        let levels = 300;
        // Made by fds: the path is far longer than PATH_MAX.
        let mut fd = open(t.path());
        for _ in 0..levels {
            rustix::fs::mkdirat(&fd, name.as_str(), Mode::from_raw_mode(0o755)).expect("mkdir");
            fd = rustix::fs::openat(&fd, name.as_str(), DIR_FLAGS, Mode::empty()).expect("open");
        }
        let f = rustix::fs::openat(
            &fd,
            "leaf",
            OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .expect("create");
        drop((f, fd));
        let mut c = Count {
            tree: Some(t.path().to_path_buf()),
            ..Count::default()
        };
        walk(open(t.path()).as_fd(), Options::default(), &mut c).expect("walk");
        assert_eq!((c.dirs, c.files), (levels, 1));
        assert_eq!(c.deepest, levels + 1);
        // Deepest first, the top last.
        assert_eq!(c.left.len(), levels + 1);
        assert_eq!(c.left.first().map(|p| p.components().count()), Some(levels));
        assert_eq!(c.left.last(), Some(&PathBuf::new()));
        assert!(
            c.most_fds <= KEPT_FDS + 3,
            "{} fds open in the tree at once",
            c.most_fds
        );
        assert_eq!(fds_in(t.path()), 0, "every fd is closed");
    }

    /// A symlink to a directory is an entry, never entered.
    #[test]
    fn symlinks_are_not_followed() {
        let t = tempfile::tempdir().expect("tempdir");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("secret")).expect("mkdir");
        let top = t.path().join("top");
        std::fs::create_dir_all(top.join("a")).expect("mkdir");
        std::os::unix::fs::symlink(&outside, top.join("a/link")).expect("symlink");
        let mut c = Count::default();
        walk(open(&top).as_fd(), Options::default(), &mut c).expect("walk");
        assert_eq!((c.dirs, c.files), (1, 1));
    }

    /// Stop ends the walk at once.
    #[test]
    fn stop_ends_the_walk() {
        struct First(usize);
        impl Visitor for First {
            fn entry(&mut self, _e: &Entry<'_>) -> io::Result<Step> {
                self.0 += 1;
                Ok(Step::Stop)
            }
        }
        let t = tempfile::tempdir().expect("tempdir");
        for n in ["a", "b", "c"] {
            std::fs::write(t.path().join(n), "x").expect("write");
        }
        let mut v = First(0);
        walk(open(t.path()).as_fd(), Options::default(), &mut v).expect("walk");
        assert_eq!(v.0, 1);
    }
}
