//! Archiving a host tree (`sifbox cp` out of a host path, eval's task
//! files): opened once, walked through directory fds, nothing below the
//! top followed (see the module's note in `transfer`).

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, CWD};
use rustix::io::Errno;
use sifbox_sys::beneath;

/// One name of a tree being archived, as the fd opened on it shows it.
enum Node {
    /// Opened for reading its entries.
    Dir(OwnedFd),
    /// Opened for reading, the inode the `O_PATH` fd showed.
    File(File),
    Link(OsString),
    /// A fifo or a device: its header only.
    Special,
    /// Cannot be archived; left out.
    Socket,
}

/// What [`open_node`] found at a name.
enum Found {
    Node(Node, std::fs::Metadata),
    /// Nothing there (any more).
    Gone,
    /// It changed into something else between two opens.
    Changed,
}

/// Opens `name` in `dir` without following it (only the final component
/// is not followed: `name` is one component, except for the source the user
/// named, whose parents are the user's own path).
fn open_node(dir: BorrowedFd<'_>, name: &Path) -> std::io::Result<Found> {
    let fd = match beneath::open_handle(dir, name) {
        Ok(fd) => File::from(fd),
        Err(Errno::NOENT) => return Ok(Found::Gone),
        Err(e) => return Err(e.into()),
    };
    let meta = fd.metadata()?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = rustix::fs::readlinkat(&fd, "", Vec::new())?;
        let target = OsString::from_vec(target.into_bytes());
        return Ok(Found::Node(Node::Link(target), meta));
    }
    if ft.is_socket() {
        return Ok(Found::Node(Node::Socket, meta));
    }
    if !ft.is_dir() && !ft.is_file() {
        return Ok(Found::Node(Node::Special, meta));
    }
    // An O_PATH fd cannot be read: open the name again, still not
    // following it, and keep what opens only if it is the same inode.
    let mut flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    flags |= if ft.is_dir() {
        OFlags::DIRECTORY
    } else {
        OFlags::NONBLOCK | OFlags::NOCTTY
    };
    let opened = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::NXIO) => return Ok(Found::Changed),
        Err(e) => return Err(e.into()),
    };
    let now = opened.metadata()?;
    if now.dev() != meta.dev() || now.ino() != meta.ino() {
        return Ok(Found::Changed);
    }
    let node = if ft.is_dir() {
        Node::Dir(opened.into())
    } else {
        Node::File(opened)
    };
    Ok(Found::Node(node, now))
}

/// Appends the header (and a file's data) of `node` as `name`.
fn append_node(
    b: &mut tar::Builder<impl Write>,
    name: &Path,
    node: &Node,
    meta: &std::fs::Metadata,
    executable: bool,
) -> std::io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    if executable && matches!(node, Node::File(_)) {
        h.set_mode(h.mode()? | 0o111);
    }
    match node {
        Node::Dir(_) | Node::Socket => b.append_data(&mut h, name, std::io::empty()),
        // Exactly the size in the header, whatever the file does
        // meanwhile (a short read is padded with zeros); holes kept.
        Node::File(f) => super::sparse::append_file(b, &mut h, name, f, meta.len()),
        Node::Link(target) => b.append_link(&mut h, name, target),
        Node::Special => {
            let dev = meta.rdev();
            h.set_device_major(rustix::fs::major(dev))?;
            h.set_device_minor(rustix::fs::minor(dev))?;
            b.append_data(&mut h, name, std::io::empty())
        }
    }
}

/// A directory being archived: its fd, its name in the archive, the names
/// of it not yet archived.
struct Level {
    fd: OwnedFd,
    name: PathBuf,
    rest: std::vec::IntoIter<OsString>,
}

/// Writes a tar stream of `path` to `out`, its entries named
/// `name/...` (or `name` for a file), symlinks as links, in sorted order
/// (a directory before what it holds). `path` is the user's own: its
/// parents are followed and it is opened once; nothing below it is followed
/// (see the module's note).
pub fn write_tar(path: &Path, name: &str, out: impl Write) -> std::io::Result<()> {
    write_tar_marking(path, name, None, out)
}

/// [`write_tar`], the regular file at `executable` (a path in the
/// archive, `name/...`) given the execute bits, as `chmod +x` after the
/// copy would: how eval hands over a task's scripts in one transfer.
pub fn write_tar_marking(
    path: &Path,
    name: &str,
    executable: Option<&Path>,
    out: impl Write,
) -> std::io::Result<()> {
    let mut b = tar::Builder::new(out);
    let at = |e: std::io::Error, p: &Path| {
        std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
    };
    // Errors about `path` itself go out bare: callers name it.
    let (node, meta) = match open_node(CWD, path)? {
        Found::Node(n, m) => (n, m),
        Found::Gone => return Err(Errno::NOENT.into()),
        Found::Changed => return Err(std::io::Error::other("it changed while being opened")),
    };
    if matches!(node, Node::Socket) {
        return Err(std::io::Error::other("a socket cannot be copied"));
    }
    let top = PathBuf::from(name);
    append_node(
        &mut b,
        &top,
        &node,
        &meta,
        executable == Some(top.as_path()),
    )?;
    let mut stack = Vec::new();
    if let Node::Dir(fd) = node {
        let rest = beneath::names(&fd)?.into_iter();
        stack.push(Level {
            fd,
            name: top,
            rest,
        });
    }
    while let Some(level) = stack.last_mut() {
        let Some(n) = level.rest.next() else {
            stack.pop();
            continue;
        };
        let arch = level.name.join(&n);
        let host = || path.join(arch.strip_prefix(name).unwrap_or(&arch));
        let (node, meta) = match open_node(level.fd.as_fd(), Path::new(&n)) {
            Ok(Found::Node(node, meta)) => (node, meta),
            Ok(Found::Gone) => {
                tracing::warn!("{}: gone while being copied; left out", host().display());
                continue;
            }
            Ok(Found::Changed) => {
                tracing::warn!("{}: changed while being copied; left out", host().display());
                continue;
            }
            Err(e) => return Err(at(e, &host())),
        };
        if matches!(node, Node::Socket) {
            tracing::debug!("{}: a socket; left out", host().display());
            continue;
        }
        let marked = executable == Some(arch.as_path());
        append_node(&mut b, &arch, &node, &meta, marked).map_err(|e| at(e, &host()))?;
        if let Node::Dir(fd) = node {
            let rest = beneath::names(&fd).map_err(|e| at(e, &host()))?.into_iter();
            stack.push(Level {
                fd,
                name: arch,
                rest,
            });
        }
    }
    b.into_inner()?.flush()
}

/// [`write_tar`] of what `path` leads to when it is a symlink (`cp -L`),
/// the entries still named `name` (the link's name); below it, nothing is
/// followed. `path` is the user's own, resolved once; should its target
/// change meanwhile, the walk sees what is there (a link stays a link).
pub fn write_tar_following(path: &Path, name: &str, out: impl Write) -> std::io::Result<()> {
    let target = std::fs::canonicalize(path)?;
    write_tar(&target, name, out)
}
