//! Reading a tree the build does not trust (the build context, a heredoc or
//! `COPY --from` staging dir) through file descriptors, never by path.
//!
//! A path named by a Dockerfile is looked up as BuildKit looks it up in the
//! context it was sent: beneath the tree's directory fd, one component at a
//! time (`openat(O_PATH|O_NOFOLLOW)` on the fd of the directory before), a
//! symlink resolved as if the tree were `/` (an absolute target starts again
//! at the tree's root, `..` stops there), at most [`MAX_LINKS`] symlinks.
//! Each step can be refused by the caller (`.dockerignore`: what is excluded
//! is not there, as it is not sent to BuildKit), so an alias symlink cannot
//! reach an excluded file. What a lookup returns is the resolved path (real
//! directories only, no symlink in it) and an fd of what it found.
//!
//! Files are opened again later, to hash and to copy them, by that
//! resolved path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and
//! checked against what the lookup saw (device, inode, size, ctime): a
//! symlink or another file put there since is refused, never followed.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{FileType, Mode, OFlags, Stat};
use sifbox_sys::beneath;

/// The most symlinks one lookup follows (Linux's own limit).
pub const MAX_LINKS: usize = 40;

/// A directory tree read through its fd.
#[derive(Debug, Clone)]
pub struct Tree {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

/// Something found in a tree.
#[derive(Debug)]
pub struct Node {
    /// Its resolved path below the tree's root, `/`-separated, without
    /// symlinks; empty for the root.
    pub rel: String,
    /// An `O_PATH` fd of it.
    pub fd: OwnedFd,
    /// Its status (not followed: a symlink is a symlink).
    pub stat: Stat,
}

/// What a lookup could not do (other than not finding the path).
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("more than {MAX_LINKS} symlinks (a loop?)")]
    Loop,
    #[error("the symlink {0} has a target that is not UTF-8")]
    NotUtf8(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Node {
    /// What it is.
    pub fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == FileType::Directory
    }

    /// The target of a symlink, read from its own fd.
    pub fn read_link(&self) -> io::Result<PathBuf> {
        let t = rustix::fs::readlinkat(&self.fd, "", Vec::new())?;
        Ok(PathBuf::from(OsStr::from_bytes(t.as_bytes())))
    }
}

/// The identity and state of a file when it was looked up: a later open
/// must find the same file, unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
}

impl Seen {
    /// What `stat` says.
    pub fn of(stat: &Stat) -> Seen {
        Seen {
            dev: stat.st_dev,
            ino: stat.st_ino,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            #[allow(clippy::unnecessary_cast)]
            ctime: (stat.st_ctime as i64, stat.st_ctime_nsec as i64),
        }
    }

    /// The size seen.
    pub fn size(&self) -> u64 {
        self.size
    }
}

fn io_err(e: rustix::io::Errno) -> io::Error {
    io::Error::from(e)
}

impl Tree {
    /// Opens the directory at `path` (the caller's own path: followed).
    pub fn open(path: &Path) -> io::Result<Tree> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        Ok(Tree {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
        })
    }

    /// Where the tree is, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel` shown as a host path, for messages.
    pub fn show(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.path.clone()
        } else {
            self.path.join(rel)
        }
    }

    /// The root itself.
    pub fn root(&self) -> io::Result<Node> {
        let fd = rustix::fs::openat(
            &*self.fd,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        let stat = rustix::fs::fstat(&fd).map_err(io_err)?;
        Ok(Node {
            rel: String::new(),
            fd,
            stat,
        })
    }

    /// Looks `path` up beneath the root, as if the root were `/` (a leading
    /// `/` means the root; `..` never goes above it). The last component is
    /// followed when it is a symlink if `follow_last`, else returned as the
    /// symlink. `present(rel, is_dir)` is asked about every entry the walk
    /// steps on (its path as resolved so far, the symlink itself for a
    /// symlink); an entry it refuses is taken as not there. `None`: not
    /// found (or a non-directory where a directory is needed).
    pub fn lookup(
        &self,
        path: &str,
        follow_last: bool,
        present: &dyn Fn(&str, bool) -> bool,
    ) -> Result<Option<Node>, LookupError> {
        // The directories entered, root first: `..` pops one.
        let mut stack: Vec<(String, Node)> = Vec::new();
        // Components still to walk, the next one last.
        let mut todo: Vec<String> = path.split('/').rev().map(str::to_owned).collect();
        let mut links = 0usize;
        while let Some(c) = todo.pop() {
            match c.as_str() {
                "" | "." => continue,
                ".." => {
                    stack.pop();
                    continue;
                }
                _ => {}
            }
            let dir = stack.last().map_or(self.fd.as_fd(), |(_, n)| n.fd.as_fd());
            let fd = match beneath::open_handle(dir, c.as_str()) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(None),
                Err(e) => return Err(io_err(e).into()),
            };
            let stat = rustix::fs::fstat(&fd).map_err(io_err)?;
            let rel = match stack.last() {
                Some((_, n)) => format!("{}/{c}", n.rel),
                None => c.clone(),
            };
            let node = Node { rel, fd, stat };
            if !present(&node.rel, node.is_dir()) {
                return Ok(None);
            }
            let more = todo.iter().any(|c| !c.is_empty());
            match node.file_type() {
                FileType::Symlink if more || follow_last => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(LookupError::Loop);
                    }
                    let target = node.read_link()?;
                    let target = target.to_str().ok_or_else(|| {
                        LookupError::NotUtf8(self.show(&node.rel).display().to_string())
                    })?;
                    if target.starts_with('/') {
                        stack.clear();
                    }
                    todo.extend(target.split('/').rev().map(str::to_owned));
                }
                FileType::Directory => stack.push((c, node)),
                _ if more => return Ok(None),
                _ => {
                    // A trailing `/` after a file: not a directory.
                    if todo.is_empty() {
                        return Ok(Some(node));
                    }
                    return Ok(None);
                }
            }
        }
        match stack.pop() {
            Some((_, node)) => Ok(Some(node)),
            None => Ok(Some(self.root()?)),
        }
    }

    /// The names in the directory `dir`, sorted ([`beneath::names`]).
    pub fn list(&self, dir: &Node) -> io::Result<Vec<OsString>> {
        beneath::names(&dir.fd)
    }

    /// The entry `name` of the directory `dir`, not followed.
    pub fn child(&self, dir: &Node, name: &OsStr) -> io::Result<Node> {
        let fd = beneath::open_handle(&dir.fd, name).map_err(io_err)?;
        let stat = rustix::fs::fstat(&fd).map_err(io_err)?;
        let name = name.to_string_lossy();
        let rel = if dir.rel.is_empty() {
            name.into_owned()
        } else {
            format!("{}/{name}", dir.rel)
        };
        Ok(Node { rel, fd, stat })
    }

    /// Opens the regular file at the resolved path `rel` for reading,
    /// without following any symlink, and checks that it is the file that
    /// was `seen`, unchanged. Errors do not name the file.
    pub fn open_file(&self, rel: &str, seen: &Seen) -> io::Result<File> {
        // (`open_beneath` retries when a rename raced the lookup.)
        let fd = beneath::open_beneath(
            &*self.fd,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
        )
        .map_err(|e| {
            use rustix::io::Errno;
            // A symlink, or nothing, where the lookup saw a file.
            let changed = matches!(e, Errno::LOOP | Errno::NOENT | Errno::NOTDIR | Errno::XDEV);
            let why = if changed {
                format!("{e}: it changed during the build; run the build again")
            } else {
                e.to_string()
            };
            io::Error::new(io::Error::from(e).kind(), why)
        })?;
        let f = File::from(fd);
        self.check(&f, seen)?;
        Ok(f)
    }

    /// Checks that the open file `f` is still what was `seen`.
    pub fn check(&self, f: &File, seen: &Seen) -> io::Result<()> {
        let stat = rustix::fs::fstat(f).map_err(io_err)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || Seen::of(&stat) != *seen
        {
            return Err(io::Error::other(
                "it changed during the build; run the build again",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn all(_: &str, _: bool) -> bool {
        true
    }

    fn rel(t: &Tree, p: &str, follow: bool) -> Option<String> {
        t.lookup(p, follow, &all).expect("lookup").map(|n| n.rel)
    }

    #[test]
    fn symlinks_resolve_as_if_the_tree_were_root() {
        let outer = tempfile::tempdir().expect("tempdir");
        let root = outer.path().join("ctx");
        std::fs::create_dir_all(root.join("a/b")).expect("mkdir");
        std::fs::write(root.join("a/b/f"), "f").expect("write");
        std::fs::write(outer.path().join("decoy"), "decoy").expect("write");
        symlink("/a", root.join("abs")).expect("symlink");
        symlink("../../../../..", root.join("a/up")).expect("symlink");
        symlink("b/f", root.join("a/rel")).expect("symlink");
        symlink("loop2", root.join("loop1")).expect("symlink");
        symlink("loop1", root.join("loop2")).expect("symlink");
        symlink("..", root.join("a/b/parent")).expect("symlink");
        let t = Tree::open(&root).expect("open");
        assert_eq!(rel(&t, "abs/b/f", true).as_deref(), Some("a/b/f"));
        assert_eq!(rel(&t, "/abs/b/../b/f", true).as_deref(), Some("a/b/f"));
        assert_eq!(rel(&t, "a/up", true).as_deref(), Some(""));
        assert_eq!(rel(&t, "a/up/decoy", true), None);
        assert_eq!(rel(&t, "a/up/a/b/f", true).as_deref(), Some("a/b/f"));
        assert_eq!(rel(&t, "../../decoy", true), None);
        assert_eq!(rel(&t, "a/rel", true).as_deref(), Some("a/b/f"));
        assert_eq!(rel(&t, "a/rel", false).as_deref(), Some("a/rel"));
        assert_eq!(rel(&t, "a/b/parent/rel", true).as_deref(), Some("a/b/f"));
        assert_eq!(rel(&t, "a/b/f/", true), None);
        assert_eq!(rel(&t, "a/b/f/x", true), None);
        assert!(matches!(
            t.lookup("loop1", true, &all),
            Err(LookupError::Loop)
        ));
        // Refused entries are not there, whatever the way to them.
        let no_b = |r: &str, _: bool| r != "a/b";
        assert!(t.lookup("abs/b/f", true, &no_b).expect("lookup").is_none());
        assert!(t.lookup("a/rel", true, &no_b).expect("lookup").is_none());
    }

    #[test]
    fn a_file_swapped_for_a_symlink_is_refused() {
        let outer = tempfile::tempdir().expect("tempdir");
        let root = outer.path().join("ctx");
        std::fs::create_dir_all(root.join("d")).expect("mkdir");
        std::fs::write(root.join("d/f"), "ok").expect("write");
        std::fs::write(outer.path().join("decoy"), "decoy").expect("write");
        let t = Tree::open(&root).expect("open");
        let n = t.lookup("d/f", true, &all).expect("lookup").expect("found");
        let seen = Seen::of(&n.stat);
        assert!(t.open_file("d/f", &seen).is_ok());
        // The file changes: refused.
        std::fs::write(root.join("d/f"), "changed!").expect("write");
        assert!(t.open_file("d/f", &seen).is_err());
        // A directory on the way becomes a symlink out: refused.
        std::fs::rename(root.join("d"), root.join("d2")).expect("rename");
        symlink(outer.path(), root.join("d")).expect("symlink");
        std::fs::write(outer.path().join("f"), "decoy").expect("write");
        let err = t.open_file("d/f", &seen).expect_err("followed a symlink");
        assert!(
            err.to_string().contains("changed during the build"),
            "{err}"
        );
    }
}
