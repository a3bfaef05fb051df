//! Copying files and directories into and out of a sandbox (`sifbox cp`).
//!
//! Both directions move a tar stream through a pipe, so nothing is held
//! whole in memory. Archives keep symlinks as links (never followed),
//! modes and mtimes. The sandbox side runs inside the sandbox; the host side
//! runs as the caller, and there both ends are hostile: a sandbox writes the
//! stream of a download, and it can change a host directory bound into it
//! while an upload reads that directory. So no path is ever resolved twice
//! and nothing below the path the user named is followed:
//!
//! - [`write_tar`] opens the source once and walks below it through
//!   directory fds: each name is opened with `O_PATH | O_NOFOLLOW`, its header
//!   comes from `fstat` of that fd, a link's target from `readlinkat` on it,
//!   and data from a reopen (`O_NOFOLLOW`) that must be the same inode. A name
//!   that changes under the walk is stored as what was opened, or left out
//!   with a warning.
//! - Unpacking ([`unpack_tar`], [`unpack_to_host`], [`extract_tar`]) reaches
//!   every parent from the destination's fd one component at a time with
//!   `openat(O_NOFOLLOW | O_DIRECTORY)`, so no `..`, absolute name or symlink
//!   (one placed earlier in the stream or already in the destination) leads
//!   outside it; entries are created with `*at()` calls and their owners,
//!   modes and times set on the fd of what was created. Directory modes are
//!   applied at the end on a reopened fd that is checked to be a directory. A
//!   path that the stream writes twice with different types, and a hard link
//!   to anything but a regular file the stream wrote before, are refused.
//!   On the host, setuid and setgid bits are dropped unless asked for.
//! - Files with holes travel as sparse entries and land with their holes
//!   ([`sparse`]); what an unpacking writes is counted against its
//!   [`Limits`] as it goes, and an unpacking that fails removes what it made.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use cap_std::fs::Dir;
use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid, CWD};
use rustix::io::Errno;

pub mod sparse;

pub use sparse::{LimitExceeded, Limits};

/// What becomes of the setuid and setgid bits of unpacked entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetId {
    /// Kept: inside a sandbox, where a setuid file gives nothing its root
    /// does not have already, and for copies the caller keeps private.
    Keep,
    /// Dropped: downloads to the host, where a setuid file that a sandbox
    /// planted would run with the rights of whoever owns it (root, when
    /// root downloads).
    Strip,
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

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
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
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
        Node::File(f) => sparse::append_file(b, &mut h, name, f, meta.len()),
        Node::Link(target) => b.append_link(&mut h, name, target),
        Node::Special => {
            let dev = meta.rdev();
            h.set_device_major(rustix::fs::major(dev))?;
            h.set_device_minor(rustix::fs::minor(dev))?;
            b.append_data(&mut h, name, std::io::empty())
        }
    }
}

/// The entries of the directory `dir`, sorted (archives are deterministic).
fn names(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for e in rustix::fs::Dir::new(dir.try_clone()?)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_os_string());
        }
    }
    out.sort();
    Ok(out)
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
        let rest = names(&fd)?.into_iter();
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
            let rest = names(&fd).map_err(|e| at(e, &host()))?.into_iter();
            stack.push(Level {
                fd,
                name: arch,
                rest,
            });
        }
    }
    b.into_inner()?.flush()
}

// ---------------------------------------------------------------------------
// Unpacking
// ---------------------------------------------------------------------------

/// Where an unpacked `name` lands: `dst/name` when `dst` is a directory,
/// else `dst` itself (its parent must exist), as `docker cp` does. `dst` is
/// the user's own path: it is followed.
fn placement(dst: &Path, name: &str) -> std::io::Result<(PathBuf, String)> {
    if std::fs::metadata(dst).is_ok_and(|m| m.is_dir()) {
        return Ok((dst.to_path_buf(), name.to_string()));
    }
    let parent = dst
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = dst
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", dst.display())))?;
    Ok((parent.to_path_buf(), base.to_string()))
}

/// The relative path of an entry inside the destination: its first
/// component (`name`) becomes `rename`; anything but plain names is refused.
fn entry_path(raw: &Path, name: &str, rename: &str) -> std::io::Result<PathBuf> {
    let refuse = || std::io::Error::other(format!("refused: not a plain name below {name}"));
    let mut parts = raw.components().filter(|c| !matches!(c, Component::CurDir));
    match parts.next() {
        Some(Component::Normal(first)) if first == name => {}
        _ => return Err(refuse()),
    }
    let mut out = PathBuf::from(rename);
    for c in parts {
        match c {
            Component::Normal(n) => out.push(n),
            _ => return Err(refuse()),
        }
    }
    Ok(out)
}

/// Unpacks a tar stream made by [`write_tar`] at `dst` (see [`placement`]),
/// confined to the destination's directory, setuid and setgid bits kept:
/// the sandbox side of an upload. With `owner`, everything written is
/// chowned to it.
pub fn unpack_tar(
    input: impl Read,
    dst: &Path,
    name: &str,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let (base, rename) = placement(dst, name)?;
    let root = open_root(&base)?;
    let map = |raw: &Path| entry_path(raw, name, &rename);
    unpack_with(input, root, map, owner, SetId::Keep, Limits::UNLIMITED)
}

/// Unpacks a tar stream that a sandbox wrote (a download) at `dst` on the
/// host (see [`placement`]), confined to the destination's directory,
/// owned by the caller; `setid` says whether setuid and setgid bits stay.
/// Held to the default [`Limits`].
pub fn unpack_to_host(
    input: impl Read,
    dst: &Path,
    name: &str,
    setid: SetId,
) -> std::io::Result<()> {
    unpack_to_host_limited(input, dst, name, setid, Limits::default())
}

/// [`unpack_to_host`] held to `limits`: past one, the unpacking stops
/// with [`LimitExceeded`] and what it made is removed.
pub fn unpack_to_host_limited(
    input: impl Read,
    dst: &Path,
    name: &str,
    setid: SetId,
    limits: Limits,
) -> std::io::Result<()> {
    let (base, rename) = placement(dst, name)?;
    let root = open_root(&base)?;
    let map = |raw: &Path| entry_path(raw, name, &rename);
    unpack_with(input, root, map, None, setid, limits)
}

/// Unpacks a tar stream whose entries are relative names into the directory
/// `dst`, made with its parents when missing, confined to it. Entries belong
/// to `owner` when given, else to the caller (root inside a sandbox).
pub fn extract_tar(input: impl Read, dst: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    let root = open_root(dst)?;
    unpack_with(
        input,
        root,
        relative_name,
        owner,
        SetId::Keep,
        Limits::UNLIMITED,
    )
}

/// Unpacks a tar stream of relative names (`sifbox cp - NAME:DIR`, as
/// `docker cp -` takes it) into `dst`, which must be a directory that
/// exists (the user's path, followed), confined to it as every unpacking
/// is (see the module's note): a `..` or absolute name is refused, and no
/// symlink, of the stream or already there, is followed. Setuid and setgid
/// bits are kept, as uploads keep them; entries belong to `owner` when
/// given, else to the caller (root inside a sandbox).
pub fn extract_into(
    input: impl Read,
    dst: &Path,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root = rustix::fs::openat(CWD, dst, flags, Mode::empty()).map_err(|e| match e {
        Errno::NOENT => std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such directory (a tar stream is unpacked into a directory that exists)",
        ),
        Errno::NOTDIR => std::io::Error::other(
            "not a directory (a tar stream is unpacked into a directory that exists)",
        ),
        e => e.into(),
    })?;
    unpack_with(
        input,
        root,
        relative_name,
        owner,
        SetId::Keep,
        Limits::UNLIMITED,
    )
}

/// An entry's name as a path below the destination: plain components only
/// (`.` dropped); `..`, an absolute name or anything else is refused.
fn relative_name(raw: &Path) -> std::io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(std::io::Error::other("refused: not a plain relative name")),
        }
    }
    Ok(out)
}

/// Copies a tar stream that a sandbox wrote of a path called `name` (a
/// download to stdout, `sifbox cp NAME:/path -`) to `out`, entry by entry,
/// held to what unpacking it on the host allows ([`unpack_to_host`]), so
/// that whoever extracts the copy (`tar -x`, as root perhaps) gets no more
/// than a download would give: names are `name` or below it, plain
/// components only (no `..`, no absolute name); no entry lies below a
/// symlink or file that the stream sent, nor sends a path twice with
/// different types; a hard link points only at a regular file sent earlier;
/// fifos and devices are left out (a download leaves them out too); setuid
/// and setgid bits are dropped unless `setid` keeps them. Owners stay the
/// numeric ids seen inside the sandbox; modes, times, data and link targets
/// are as they came. On an error, what was written stays (with no end
/// marker, so `tar` reports the stream as cut short).
pub fn retar(input: impl Read, name: &str, setid: SetId, out: impl Write) -> std::io::Result<()> {
    retar_limited(input, name, setid, Limits::default(), out)
}

/// [`retar`] held to `limits` (file data and entries passed on): past one,
/// it stops with [`LimitExceeded`].
pub fn retar_limited(
    input: impl Read,
    name: &str,
    setid: SetId,
    limits: Limits,
    out: impl Write,
) -> std::io::Result<()> {
    let mut b = tar::Builder::new(out);
    let mut sent: HashMap<PathBuf, Written> = HashMap::new();
    let mut budget = sparse::Budget::new(limits);
    let mut archive = tar::Archive::new(input);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let (raw, sp) = entry_name(&mut entry)?;
        budget.entry()?;
        let mut r = Retar {
            b: &mut b,
            sent: &mut sent,
            budget: &mut budget,
        };
        r.entry(name, setid, &raw, sp.as_ref(), &mut entry)
            .map_err(|e| with_entry(e, &raw))?;
    }
    // As in unpacking: read the padding, so that the writer sees no closed
    // pipe.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink())?;
    b.into_inner()?.flush()
}

/// An entry's name, and what its PAX header says of it when it is sparse
/// (whose real name is there).
fn entry_name(
    entry: &mut tar::Entry<'_, impl Read>,
) -> std::io::Result<(PathBuf, Option<sparse::Sparse>)> {
    let sp = sparse::sparse_of(entry)?;
    let raw = match &sp {
        Some(s) => s.name.clone(),
        None => entry.path()?.into_owned(),
    };
    Ok((raw, sp))
}

/// `e` with the entry it is about; a passed limit stays as it is (its
/// caller names the flag).
fn with_entry(e: std::io::Error, raw: &Path) -> std::io::Error {
    if LimitExceeded::find(&e).is_some() {
        return e;
    }
    std::io::Error::new(e.kind(), format!("archive entry {}: {e}", raw.display()))
}

/// The state of one [`retar`].
struct Retar<'a, W: Write> {
    b: &'a mut tar::Builder<W>,
    sent: &'a mut HashMap<PathBuf, Written>,
    budget: &'a mut sparse::Budget,
}

impl<W: Write> Retar<'_, W> {
    /// One entry of [`retar`].
    fn entry(
        &mut self,
        name: &str,
        setid: SetId,
        raw: &Path,
        sp: Option<&sparse::Sparse>,
        entry: &mut tar::Entry<'_, impl Read>,
    ) -> std::io::Result<()> {
        let (b, sent) = (&mut *self.b, &mut *self.sent);
        let rel = entry_path(raw, name, name)?;
        let header = entry.header();
        let kind = header.entry_type();
        let new = if kind.is_dir() {
            Written::Dir
        } else if kind.is_symlink() {
            Written::Symlink
        } else if kind.is_hard_link() || kind.is_file() || kind == tar::EntryType::Continuous {
            Written::File { dev: 0, ino: 0 }
        } else {
            tracing::debug!("leaving out special file {}", raw.display());
            return Ok(());
        };
        for above in rel.ancestors().skip(1) {
            if let Some(w) = sent.get(above).filter(|w| !matches!(w, Written::Dir)) {
                return Err(std::io::Error::other(format!(
                    "below {}, which this stream sent as {}: refused",
                    above.display(),
                    w.what()
                )));
            }
        }
        if let Some(old) = sent.get(&rel) {
            if std::mem::discriminant(old) != std::mem::discriminant(&new) {
                return Err(std::io::Error::other(format!(
                    "this stream sent {} there before and now sends {}: refused",
                    old.what(),
                    new.what()
                )));
            }
        }
        let mut mode = header.mode().unwrap_or(0o644) & 0o7777;
        if setid == SetId::Strip {
            mode &= !0o6000;
        }
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_mtime(header.mtime().unwrap_or(0));
        h.set_uid(header.uid().unwrap_or(0));
        h.set_gid(header.gid().unwrap_or(0));
        h.set_size(0);
        if kind.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            b.append_data(&mut h, &rel, std::io::empty())?;
        } else if kind.is_symlink() {
            let target = entry.link_name()?.ok_or_else(|| {
                std::io::Error::other(format!("symlink {} has no target", raw.display()))
            })?;
            h.set_entry_type(tar::EntryType::Symlink);
            b.append_link(&mut h, &rel, target)?;
        } else if kind.is_hard_link() {
            let target = entry.link_name()?.ok_or_else(|| {
                std::io::Error::other(format!("hard link {} has no target", raw.display()))
            })?;
            let trel = entry_path(&target, name, name).map_err(|e| {
                let to = target.display();
                std::io::Error::new(e.kind(), format!("a hard link to {to}: {e}"))
            })?;
            if !matches!(sent.get(&trel), Some(Written::File { .. })) {
                return Err(std::io::Error::other(format!(
                    "a hard link to {}, which is not a regular file sent earlier in this stream: \
                 refused",
                    target.display()
                )));
            }
            h.set_entry_type(tar::EntryType::Link);
            b.append_link(&mut h, &rel, &trel)?;
        } else if let Some(sp) = sp {
            // Passed on sparse, under the checked name.
            let size = entry.size();
            let extents = sparse::read_map(entry, size, sp.real_size)?;
            let stored: u64 = extents.iter().map(|e| e.1).sum();
            self.budget.bytes(stored)?;
            sparse::append_sparse(b, &h, &rel, sp.real_size, &extents, entry.by_ref())?;
        } else {
            // Exactly the size in the header: a stream cut short is padded
            // here and fails at its next header.
            let size = entry.size();
            self.budget.bytes(size)?;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(size);
            let data = entry
                .by_ref()
                .take(size)
                .chain(std::io::repeat(0))
                .take(size);
            b.append_data(&mut h, &rel, data)?;
        }
        sent.insert(rel, new);
        Ok(())
    }
}

/// [`write_tar`] of what `path` leads to when it is a symlink (`cp -L`),
/// the entries still named `name` (the link's name); below it, nothing is
/// followed. `path` is the user's own, resolved once; should its target
/// change meanwhile, the walk sees what is there (a link stays a link).
pub fn write_tar_following(path: &Path, name: &str, out: impl Write) -> std::io::Result<()> {
    let target = std::fs::canonicalize(path)?;
    write_tar(&target, name, out)
}

/// The destination directory (the user's path, followed).
fn open_root(base: &Path) -> std::io::Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::openat(CWD, base, flags, Mode::empty()).map_err(|e| {
        let e = std::io::Error::from(e);
        std::io::Error::new(e.kind(), format!("{}: {e}", base.display()))
    })
}

/// What this stream has written at a path.
#[derive(Debug, Clone, Copy)]
enum Written {
    Dir,
    /// The inode, for hard links to it.
    File {
        dev: u64,
        ino: u64,
    },
    Symlink,
}

impl Written {
    fn what(self) -> &'static str {
        match self {
            Written::Dir => "a directory",
            Written::File { .. } => "a file",
            Written::Symlink => "a symlink",
        }
    }
}

/// The state of one unpacking.
struct Unpacker<M> {
    root: OwnedFd,
    map: M,
    owner: Option<(u32, u32)>,
    setid: SetId,
    written: HashMap<PathBuf, Written>,
    /// Directories and the mode and mtime they get at the end.
    dirs: HashMap<PathBuf, (u32, u64)>,
    /// What this unpacking made, in order: removed, last first, when it
    /// fails.
    created: Vec<PathBuf>,
    budget: sparse::Budget,
}

fn unpack_with(
    input: impl Read,
    root: OwnedFd,
    map: impl Fn(&Path) -> std::io::Result<PathBuf>,
    owner: Option<(u32, u32)>,
    setid: SetId,
    limits: Limits,
) -> std::io::Result<()> {
    let mut u = Unpacker {
        root,
        map,
        owner,
        setid,
        written: HashMap::new(),
        dirs: HashMap::new(),
        created: Vec::new(),
        budget: sparse::Budget::new(limits),
    };
    let mut archive = tar::Archive::new(input);
    let r = (|| -> std::io::Result<()> {
        for entry in archive.entries()? {
            let mut entry = entry?;
            let (raw, sp) = entry_name(&mut entry)?;
            u.budget.entry()?;
            u.entry(&raw, sp.as_ref(), &mut entry)
                .map_err(|e| with_entry(e, &raw))?;
        }
        Ok(())
    })();
    if let Err(e) = r {
        u.remove_created();
        return Err(e);
    }
    // Read what follows the end-of-archive marker (tar pads its output to
    // whole records), so that the writer never sees a closed pipe.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink())?;
    u.finish_dirs()
}

impl<M: Fn(&Path) -> std::io::Result<PathBuf>> Unpacker<M> {
    /// Removes what this unpacking made, last first, each reached from the
    /// root without following anything; what cannot be removed stays.
    fn remove_created(&mut self) {
        for rel in self.created.drain(..).rev() {
            let Ok((parent, file)) = split(&rel) else {
                continue;
            };
            let Ok(dir) = walk(&self.root, &parent, None) else {
                continue;
            };
            let st = rustix::fs::statat(&dir, &file, AtFlags::SYMLINK_NOFOLLOW);
            let flags = match st {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    // Its mode may forbid removing what is in it.
                    if let Ok(d) = open_dir(&dir, &file, None) {
                        let _ = rustix::fs::chmodat(
                            &d,
                            "",
                            Mode::from_raw_mode(0o700),
                            AtFlags::EMPTY_PATH,
                        );
                    }
                    AtFlags::REMOVEDIR
                }
                Ok(_) => AtFlags::empty(),
                Err(_) => continue,
            };
            if let Err(e) = rustix::fs::unlinkat(&dir, &file, flags) {
                tracing::warn!("{}: not removed after the failed copy: {e}", rel.display());
            }
        }
    }

    fn entry(
        &mut self,
        raw: &Path,
        sp: Option<&sparse::Sparse>,
        entry: &mut tar::Entry<'_, impl Read>,
    ) -> std::io::Result<()> {
        let rel = (self.map)(raw)?;
        if rel.as_os_str().is_empty() {
            // `./`: the destination itself, which exists.
            return Ok(());
        }
        let header = entry.header();
        let mut mode = header.mode().unwrap_or(0o644) & 0o7777;
        if self.setid == SetId::Strip {
            mode &= !0o6000;
        }
        let mode = Mode::from_raw_mode(mode);
        let mtime = header.mtime().unwrap_or(0);
        let kind = header.entry_type();
        let (parent, file) = split(&rel)?;
        let new = if kind.is_dir() {
            Written::Dir
        } else if kind.is_symlink() {
            Written::Symlink
        } else if kind.is_hard_link() || kind.is_file() || kind == tar::EntryType::Continuous {
            Written::File { dev: 0, ino: 0 }
        } else {
            tracing::debug!("skipping special file {}", raw.display());
            return Ok(());
        };
        if let Some(old) = self.written.get(&rel) {
            if std::mem::discriminant(old) != std::mem::discriminant(&new) {
                return Err(std::io::Error::other(format!(
                    "this stream wrote {} there before and now sends {}: refused",
                    old.what(),
                    new.what()
                )));
            }
        }
        if kind.is_dir() {
            let pdir = walk(&self.root, &parent, Some(&mut self.created))?;
            if make_dir(&pdir, &file, Mode::from_raw_mode(0o700))? {
                self.created.push(rel.clone());
            }
            let dir = open_dir(&pdir, &file, None)?;
            if let Some((uid, gid)) = self.owner {
                rustix::fs::chownat(&dir, "", ids(uid), gids(gid), AtFlags::EMPTY_PATH)?;
            }
            self.written.insert(rel.clone(), Written::Dir);
            self.dirs.insert(rel, (mode.as_raw_mode(), mtime));
            return Ok(());
        }
        let dir = walk(&self.root, &parent, None)?;
        if kind.is_hard_link() {
            let target = entry.link_name()?.ok_or_else(|| {
                std::io::Error::other(format!("hard link {} has no target", raw.display()))
            })?;
            let trel = (self.map)(&target).map_err(|e| {
                let to = target.display();
                std::io::Error::new(e.kind(), format!("a hard link to {to}: {e}"))
            })?;
            let Some(&Written::File { dev, ino }) = self.written.get(&trel) else {
                return Err(std::io::Error::other(format!(
                    "a hard link to {}, which is not a regular file written earlier in this \
                     stream: refused",
                    target.display()
                )));
            };
            let (tparent, tfile) = split(&trel)?;
            let tdir = walk(&self.root, &tparent, None)?;
            clear(&dir, &file)?;
            rustix::fs::linkat(&tdir, &tfile, &dir, &file, AtFlags::empty())?;
            self.created.push(rel.clone());
            // The name may have been swapped since it was written (in a
            // directory the sandbox also sees): keep the link only if it is
            // the inode this stream wrote.
            let st = rustix::fs::statat(&dir, &file, AtFlags::SYMLINK_NOFOLLOW)?;
            if st.st_dev != dev || st.st_ino != ino {
                let _ = rustix::fs::unlinkat(&dir, &file, AtFlags::empty());
                return Err(std::io::Error::other(format!(
                    "{} changed since this stream wrote it",
                    target.display()
                )));
            }
            self.written.insert(rel, Written::File { dev, ino });
            return Ok(());
        }
        clear(&dir, &file)?;
        if kind.is_symlink() {
            let target = entry.link_name()?.ok_or_else(|| {
                std::io::Error::other(format!("symlink {} has no target", raw.display()))
            })?;
            rustix::fs::symlinkat(target.as_ref(), &dir, &file)?;
            self.created.push(rel.clone());
            // By name, not following: exact for the link just made (a name
            // swapped meanwhile is one the sandbox can change anyway).
            if let Some((uid, gid)) = self.owner {
                let nofollow = AtFlags::SYMLINK_NOFOLLOW;
                rustix::fs::chownat(&dir, &file, ids(uid), gids(gid), nofollow)?;
            }
            rustix::fs::utimensat(&dir, &file, &times(mtime), AtFlags::SYMLINK_NOFOLLOW)?;
            self.written.insert(rel, Written::Symlink);
            return Ok(());
        }
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut f = File::from(rustix::fs::openat(
            &dir,
            &file,
            flags,
            Mode::from_raw_mode(0o600),
        )?);
        self.created.push(rel.clone());
        match sp {
            Some(sp) => {
                let size = entry.size();
                let extents = sparse::read_map(entry, size, sp.real_size)?;
                sparse::write_extents(entry, &extents, sp.real_size, &f, &mut self.budget)?;
            }
            None => sparse::write_plain(entry, &mut f, &mut self.budget)?,
        }
        // Owner first: chown clears setuid and setgid bits.
        if let Some((uid, gid)) = self.owner {
            rustix::fs::fchown(&f, ids(uid), gids(gid))?;
        }
        rustix::fs::fchmod(&f, mode)?;
        rustix::fs::futimens(&f, &times(mtime))?;
        let st = rustix::fs::fstat(&f)?;
        self.written.insert(
            rel,
            Written::File {
                dev: st.st_dev,
                ino: st.st_ino,
            },
        );
        Ok(())
    }

    /// Directories last, deepest first: their modes may forbid writing and
    /// writing into them moves their mtimes. Each is reopened beneath the
    /// root without following anything and checked to be a directory.
    fn finish_dirs(self) -> std::io::Result<()> {
        let mut dirs: Vec<_> = self.dirs.into_iter().collect();
        dirs.sort_by(|a, b| {
            let depth = |p: &Path| p.components().count();
            depth(&b.0).cmp(&depth(&a.0)).then_with(|| b.0.cmp(&a.0))
        });
        for (rel, (mode, mtime)) in dirs {
            let set = || -> std::io::Result<()> {
                let (parent, file) = split(&rel)?;
                let pdir = walk(&self.root, &parent, None)?;
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let dir =
                    rustix::fs::openat(&pdir, &file, flags, Mode::empty()).map_err(not_a_dir)?;
                is_dir(&dir)?;
                rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))?;
                rustix::fs::futimens(&dir, &times(mtime))?;
                Ok(())
            };
            set().map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("setting the mode of {}: {e}", rel.display()),
                )
            })?;
        }
        Ok(())
    }
}

/// The directory `rel` below `root`, reached one component at a time
/// without following any symlink (one there is an error, never a way
/// out). With `made`, missing components are created and their paths
/// pushed onto it.
fn walk(
    root: &OwnedFd,
    rel: &Path,
    mut made: Option<&mut Vec<PathBuf>>,
) -> std::io::Result<OwnedFd> {
    let mut cur: Option<OwnedFd> = None;
    let mut so_far = PathBuf::new();
    for c in rel.components() {
        let Component::Normal(n) = c else {
            return Err(std::io::Error::other(format!("bad path {}", rel.display())));
        };
        so_far.push(n);
        let base = cur.as_ref().map_or(root.as_fd(), AsFd::as_fd);
        let named =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", so_far.display()));
        if let Some(made) = made.as_deref_mut() {
            if make_dir(&base, Path::new(n), Mode::from_raw_mode(0o755)).map_err(named)? {
                made.push(so_far.clone());
            }
        }
        let next = open_dir(&base, Path::new(n), None).map_err(named)?;
        cur = Some(next);
    }
    match cur {
        Some(fd) => Ok(fd),
        None => root.try_clone(),
    }
}

/// Makes the directory `name` in `dir` unless something is there: whether
/// it made it.
fn make_dir(dir: &impl AsFd, name: &Path, mode: Mode) -> std::io::Result<bool> {
    match rustix::fs::mkdirat(dir, name, mode) {
        Ok(()) => Ok(true),
        Err(Errno::EXIST) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The directory `name` in `dir` as an `O_PATH` fd, not following a
/// symlink; made (with `make`'s mode) when missing.
fn open_dir(dir: &impl AsFd, name: &Path, make: Option<Mode>) -> std::io::Result<OwnedFd> {
    if let Some(mode) = make {
        match rustix::fs::mkdirat(dir, name, mode) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(not_a_dir)?;
    is_dir(&fd)?;
    Ok(fd)
}

/// Callers name the path.
fn not_a_dir(e: Errno) -> std::io::Error {
    match e {
        Errno::NOTDIR | Errno::LOOP => std::io::Error::other(
            "not a directory (a symlink or a file is there; it is not followed)",
        ),
        e => e.into(),
    }
}

fn is_dir(fd: &OwnedFd) -> std::io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        Ok(())
    } else {
        Err(not_a_dir(Errno::NOTDIR))
    }
}

/// Makes room for a new non-directory `file` in `dir`: whatever
/// non-directory is there (a symlink above all) is removed, not followed; a
/// directory is an error.
fn clear(dir: &OwnedFd, file: &Path) -> std::io::Result<()> {
    match rustix::fs::statat(dir, file, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            Err(std::io::Error::other("a directory is in the way"))
        }
        // Not AT_REMOVEDIR: should a directory be there by now, this fails.
        Ok(_) => Ok(rustix::fs::unlinkat(dir, file, AtFlags::empty())?),
    }
}

fn ids(uid: u32) -> Option<Uid> {
    Some(Uid::from_raw(uid))
}

fn gids(gid: u32) -> Option<Gid> {
    Some(Gid::from_raw(gid))
}

fn times(mtime: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Writes a tar stream of `/` as this process sees it: owners numeric,
/// symlinks as links, the contents of every other mount left out (a mount
/// point that is a directory stays as an empty one; one that is a file is
/// left out), sockets skipped. A regular file with several names in the
/// stream (a hard link a build step made) is written once, under the first
/// name the walk meets, and its other names are hard-link entries to that
/// one, so the image keeps one inode with all its names.
pub fn write_root_tar(out: impl Write) -> std::io::Result<()> {
    let mounts = mount_points()?;
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    // Sparse files go dense: the image's reader (`sifbox_image::layer`)
    // takes no sparse entries.
    b.sparse(false);
    // (device, inode) of each regular file with more than one link: the
    // name it was archived under.
    let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut stack = vec![PathBuf::from("/")];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        for n in names {
            let path = dir.join(&n);
            let meta = std::fs::symlink_metadata(&path)?;
            let ft = meta.file_type();
            let mounted = mounts.contains(&path);
            if ft.is_socket() || (mounted && !ft.is_dir()) {
                continue;
            }
            let name = path.strip_prefix("/").unwrap_or(&path);
            if ft.is_file() && meta.nlink() > 1 {
                let id = (meta.dev(), meta.ino());
                if let Some(first) = linked.get(&id) {
                    let mut h = tar::Header::new_gnu();
                    h.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_size(0);
                    b.append_link(&mut h, name, first)?;
                    continue;
                }
                linked.insert(id, name.to_path_buf());
            }
            b.append_path_with_name(&path, name)?;
            if ft.is_dir() && !mounted {
                stack.push(path);
            }
        }
    }
    b.into_inner()?.flush()
}

/// How deep [`give_back`] goes below its top (two descriptors a level).
const GIVE_BACK_DEPTH: usize = 256;

/// Gives `top` and every entry beneath it to root of the sandbox (that is,
/// to the caller outside): a tree on the host, bound in, that sandboxes
/// filled with files of other ids of the caller's mapping, which the caller
/// could neither read nor remove. Only those ids change: a group that is
/// not mapped here (the host group of a setgid project dir, which shows as
/// the overflow gid) stays. Every step is relative to a directory fd: no
/// symlink is followed (a link itself is given back), nothing on another
/// file system is entered, and nothing deeper than [`GIVE_BACK_DEPTH`]
/// levels. What cannot be given back is skipped; the first such error is
/// returned once the rest is done.
pub fn give_back(top: &Path) -> std::io::Result<()> {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let overflow = std::fs::read_to_string("/proc/sys/fs/overflowgid")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(65534u32);
    // The owner to set: root for an id of the mapping that is not root's,
    // unchanged (None) otherwise.
    let change = |st: &rustix::fs::Stat| {
        let uid = (st.st_uid != 0).then(|| Uid::from_raw(0));
        let gid = (st.st_gid != 0 && st.st_gid != overflow).then(|| Gid::from_raw(0));
        (uid.is_some() || gid.is_some()).then_some((uid, gid))
    };
    let top_fd = rustix::fs::open(top, dir_flags, Mode::empty())?;
    let top_st = rustix::fs::fstat(&top_fd)?;
    let dev = top_st.st_dev;
    let mut first: Option<std::io::Error> = None;
    let mut keep = |e: std::io::Error| {
        first.get_or_insert(e);
    };
    if let Some((u, g)) = change(&top_st) {
        if let Err(e) = rustix::fs::fchown(&top_fd, u, g) {
            keep(e.into());
        }
    }
    let entries = rustix::fs::Dir::read_from(&top_fd)?;
    let mut stack = vec![(top_fd, entries)];
    while let Some((fd, entries)) = stack.last_mut() {
        let entry = match entries.next() {
            None => {
                stack.pop();
                continue;
            }
            Some(Err(e)) => {
                keep(e.into());
                stack.pop();
                continue;
            }
            Some(Ok(entry)) => entry,
        };
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let st = match rustix::fs::statat(&*fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) => {
                keep(e.into());
                continue;
            }
        };
        if let Some((u, g)) = change(&st) {
            if let Err(e) = rustix::fs::chownat(&*fd, name, u, g, AtFlags::SYMLINK_NOFOLLOW) {
                keep(e.into());
            }
        }
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            continue;
        }
        // O_NOFOLLOW: a symlink (ELOOP) or what is no directory (ENOTDIR,
        // a FIFO too, unopened) is not entered.
        let sub = match rustix::fs::openat(&*fd, name, dir_flags, Mode::empty()) {
            Ok(sub) => sub,
            Err(Errno::LOOP | Errno::NOTDIR) => continue,
            Err(e) => {
                keep(e.into());
                continue;
            }
        };
        match rustix::fs::fstat(&sub) {
            Ok(st) if st.st_dev == dev => {}
            Ok(_) => continue,
            Err(e) => {
                keep(e.into());
                continue;
            }
        }
        if stack.len() >= GIVE_BACK_DEPTH {
            keep(std::io::Error::other(format!(
                "more than {GIVE_BACK_DEPTH} levels of directories"
            )));
            continue;
        }
        match rustix::fs::Dir::read_from(&sub) {
            Ok(entries) => stack.push((sub, entries)),
            Err(e) => keep(e.into()),
        }
    }
    first.map_or(Ok(()), Err)
}

/// Whether `top` or anything beneath it (not followed, on `top`'s file
/// system) belongs to another uid than `uid` or to a group not in `gids`
/// (the caller's: a setgid project dir's group is fine), or cannot be
/// looked at: what [`give_back`] is for. A `top` that does not exist has
/// nothing. Reads only metadata, by dir fds; stops at the first such entry.
pub fn anything_not_owned_by(top: &Path, uid: u32, gids: &[u32]) -> bool {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let foreign = |st: &rustix::fs::Stat| st.st_uid != uid || !gids.contains(&st.st_gid);
    let top_fd = match rustix::fs::open(top, dir_flags, Mode::empty()) {
        Ok(fd) => fd,
        // Nothing there, nothing to give back.
        Err(rustix::io::Errno::NOENT) => return false,
        Err(_) => return true,
    };
    let (dev, entries) = match (
        rustix::fs::fstat(&top_fd),
        rustix::fs::Dir::read_from(&top_fd),
    ) {
        (Ok(st), Ok(entries)) if !foreign(&st) => (st.st_dev, entries),
        _ => return true,
    };
    let mut stack = vec![(top_fd, entries)];
    loop {
        let depth = stack.len();
        let Some((fd, entries)) = stack.last_mut() else {
            break;
        };
        let entry = match entries.next() {
            None => {
                stack.pop();
                continue;
            }
            Some(Err(_)) => return true,
            Some(Ok(entry)) => entry,
        };
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(st) = rustix::fs::statat(&*fd, name, AtFlags::SYMLINK_NOFOLLOW) else {
            return true;
        };
        if foreign(&st) {
            return true;
        }
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory || st.st_dev != dev {
            continue;
        }
        if depth >= GIVE_BACK_DEPTH {
            return true;
        }
        match rustix::fs::openat(&*fd, name, dir_flags, Mode::empty())
            .and_then(|sub| rustix::fs::Dir::read_from(&sub).map(|e| (sub, e)))
        {
            Ok(next) => stack.push(next),
            Err(_) => return true,
        }
    }
    false
}

/// Gives every entry of the tree `dst` (a copy of `/` made by the caller,
/// owned by it, bound into the sandbox) the owner its original in `/` has
/// here, where it is not root's: the copy then belongs to the ids of the
/// sandbox's mapping, as the original does. Other mounts and `dst` itself
/// are left out; `dst` is reached through cap-std handles, so no symlink
/// in it leads outside it. Entries missing from `dst` are skipped.
pub fn mirror_owners(dst: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mounts = mount_points()?;
    let out = Dir::open_ambient_dir(dst, cap_std::ambient_authority())?;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = Path::new("/").join(&rel);
        let out_dir = if rel.as_os_str().is_empty() {
            out.try_clone()?
        } else {
            match out.open_dir(&rel) {
                Ok(d) => d,
                Err(_) => continue,
            }
        };
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let path = e.path();
            if path == dst || mounts.contains(&path) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path)?;
            let name = e.file_name();
            if meta.uid() != 0 || meta.gid() != 0 {
                let _ = rustix::fs::chownat(
                    &out_dir,
                    Path::new(&name),
                    Some(rustix::fs::Uid::from_raw(meta.uid())),
                    Some(rustix::fs::Gid::from_raw(meta.gid())),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                );
            }
            if meta.is_dir() {
                stack.push(rel.join(&name));
            }
        }
    }
    Ok(())
}

/// Every mount point but `/`, from /proc/self/mountinfo.
fn mount_points() -> std::io::Result<std::collections::HashSet<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|p| p != Path::new("/"))
        .collect())
}

/// Undoes mountinfo's octal escapes (`\040` for a space and so on).
fn unescape_mountinfo(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| {
            (b'0'..=b'3').contains(&d[0]) && d.iter().all(|c| (b'0'..=b'7').contains(c))
        });
        if let (b'\\', Some(d)) = (b[i], octal) {
            out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

fn split(rel: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    let file = rel
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("bad entry {}", rel.display())))?;
    let parent = rel.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok((parent, PathBuf::from(file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// give_back and anything_not_owned_by on a tree of another id with a
    /// symlink out, a FIFO and a deep chain: the link is changed, never
    /// its target; the FIFO is not opened; nothing is left of the other
    /// id but below the depth limit. (Root only: chown needs it.)
    #[test]
    fn give_back_changes_the_tree_and_follows_nothing() {
        use std::os::unix::fs::{symlink, MetadataExt};
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let t = tempfile::tempdir().expect("tmp");
        let (top, outside) = (t.path().join("top"), t.path().join("outside"));
        std::fs::create_dir_all(top.join("d/e")).expect("mkdir");
        std::fs::write(top.join("d/e/f"), "x").expect("write");
        std::fs::write(&outside, "o").expect("write");
        symlink(&outside, top.join("d/link")).expect("symlink");
        rustix::fs::mknodat(
            CWD,
            top.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        assert!(!anything_not_owned_by(&top, 0, &[0]));
        let mut deep = top.join("deep");
        for _ in 0..GIVE_BACK_DEPTH + 2 {
            deep.push("x");
        }
        std::fs::create_dir_all(&deep).expect("deep");
        let own = |p: &Path, id: u32| {
            rustix::fs::chownat(
                CWD,
                p,
                Some(Uid::from_raw(id)),
                Some(Gid::from_raw(id)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .expect("chown");
        };
        for p in ["d", "d/e", "d/e/f", "d/link", "fifo", "deep/x"] {
            own(&top.join(p), 4321);
        }
        own(&deep, 4321);
        own(&outside, 4321);
        // A group that is not mapped (seen as the overflow gid) stays.
        std::fs::write(top.join("grouped"), "g").expect("write");
        rustix::fs::chownat(
            CWD,
            top.join("grouped"),
            Some(Uid::from_raw(4321)),
            Some(Gid::from_raw(65534)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("chown");
        assert!(anything_not_owned_by(&top, 0, &[0]));
        let e = give_back(&top).expect_err("the deepest dirs are out of reach");
        assert!(e.to_string().contains("levels"), "{e}");
        for p in ["d", "d/e", "d/e/f", "d/link", "fifo", "deep/x"] {
            let md = std::fs::symlink_metadata(top.join(p)).expect("stat");
            assert_eq!((md.uid(), md.gid()), (0, 0), "{p}");
        }
        let grouped = std::fs::metadata(top.join("grouped")).expect("stat");
        assert_eq!((grouped.uid(), grouped.gid()), (0, 65534));
        assert_eq!(std::fs::metadata(&outside).expect("stat").uid(), 4321);
        assert_eq!(std::fs::symlink_metadata(&deep).expect("stat").uid(), 4321);
        // Too deep to tell counts as not owned.
        own(&deep, 0);
        assert!(anything_not_owned_by(&top, 0, &[0]));
        std::fs::remove_dir_all(top.join("deep")).expect("rm");
        // The overflow group is none of the caller's here (root's: 0).
        assert!(anything_not_owned_by(&top, 0, &[0]));
        assert!(!anything_not_owned_by(&top, 0, &[0, 65534]));
        // Nothing there is nothing to give back.
        assert!(!anything_not_owned_by(&top.join("gone"), 0, &[0]));
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("tempdir");
        let s = t.path().join("src");
        std::fs::create_dir_all(s.join("sub/empty")).expect("mkdir");
        std::fs::write(s.join("sub/f"), b"data").expect("write");
        std::fs::set_permissions(s.join("sub/f"), std::fs::Permissions::from_mode(0o4750))
            .expect("chmod");
        std::os::unix::fs::symlink("/etc/shadow", s.join("abs-link")).expect("symlink");
        std::os::unix::fs::symlink("../../x", s.join("sub/up-link")).expect("symlink");
        std::fs::hard_link(s.join("sub/f"), s.join("hard")).expect("link");
        t
    }

    #[test]
    fn marking_adds_execute_bits_to_that_one_regular_file() {
        let t = tempfile::tempdir().expect("tempdir");
        let s = t.path().join("solution");
        std::fs::create_dir_all(&s).expect("mkdir");
        for f in ["solve.sh", "helper.sh"] {
            std::fs::write(s.join(f), b"#!/bin/sh\n").expect("write");
            std::fs::set_permissions(s.join(f), std::fs::Permissions::from_mode(0o640))
                .expect("chmod");
        }
        let mode_of = |marked: Option<&Path>| {
            let mut buf = Vec::new();
            write_tar_marking(&s, "solution", marked, &mut buf).expect("tar");
            let mut a = tar::Archive::new(&buf[..]);
            let mut modes = Vec::new();
            for e in a.entries().expect("entries") {
                let e = e.expect("entry");
                let path = e.path().expect("path").display().to_string();
                modes.push((path, e.header().mode().expect("mode") & 0o7777));
            }
            modes
        };
        let plain = mode_of(None);
        let marked = mode_of(Some(Path::new("solution/solve.sh")));
        assert!(
            plain.contains(&("solution/solve.sh".into(), 0o640)),
            "{plain:?}"
        );
        assert!(
            marked.contains(&("solution/solve.sh".into(), 0o751)),
            "{marked:?}"
        );
        assert!(
            marked.contains(&("solution/helper.sh".into(), 0o640)),
            "{marked:?}"
        );
        // A directory named so is left as it is.
        let dir = mode_of(Some(Path::new("solution")));
        assert_eq!(dir, plain);
    }

    #[test]
    fn roundtrip_keeps_links_modes_and_mtimes() {
        let t = tree();
        let mut buf = Vec::new();
        write_tar(&t.path().join("src"), "src", &mut buf).expect("tar");
        let out = tempfile::tempdir().expect("tempdir");
        unpack_tar(&buf[..], out.path(), "src", None).expect("untar");
        let d = out.path().join("src");
        assert_eq!(std::fs::read(d.join("sub/f")).expect("read"), b"data");
        assert_eq!(
            std::fs::metadata(d.join("sub/f")).expect("meta").mode() & 0o7777,
            0o4750
        );
        assert_eq!(
            std::fs::read_link(d.join("abs-link")).expect("link"),
            Path::new("/etc/shadow")
        );
        assert_eq!(
            std::fs::read_link(d.join("sub/up-link")).expect("link"),
            Path::new("../../x")
        );
        assert!(d.join("sub/empty").is_dir());
        let src_mtime = std::fs::metadata(t.path().join("src/sub/f"))
            .expect("m")
            .mtime();
        assert_eq!(
            std::fs::metadata(d.join("sub/f")).expect("m").mtime(),
            src_mtime
        );
        // Hard links arrive as copies (the archive does not record them).
        assert_eq!(std::fs::read(d.join("hard")).expect("read"), b"data");
    }

    #[test]
    fn single_file_to_new_name() {
        let t = tree();
        let mut buf = Vec::new();
        write_tar(&t.path().join("src/sub/f"), "f", &mut buf).expect("tar");
        let out = tempfile::tempdir().expect("tempdir");
        unpack_tar(&buf[..], &out.path().join("renamed"), "f", None).expect("untar");
        assert_eq!(
            std::fs::read(out.path().join("renamed")).expect("read"),
            b"data"
        );
    }

    #[test]
    fn hostile_entries_are_refused() {
        let out = tempfile::tempdir().expect("tempdir");
        let dest = out.path().join("dest");
        std::fs::create_dir(&dest).expect("mkdir");
        // A symlink in the stream, then a file written through it.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "x/esc", out.path()).expect("link");
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o644);
        b.append_data(&mut h, "x/esc/pwned", &b"evil"[..])
            .expect("file");
        let data = b.into_inner().expect("tar");
        assert!(unpack_tar(&data[..], &dest, "x", None).is_err());
        assert!(!out.path().join("pwned").exists());
        // Names that climb out or are not under the expected top name.
        for bad in ["x/../../evil", "y/file"] {
            let mut raw = vec![0u8; 1024];
            let mut h = tar::Header::new_old();
            h.set_size(0);
            h.set_mode(0o644);
            h.as_old_mut().name[..bad.len()].copy_from_slice(bad.as_bytes());
            h.set_cksum();
            raw[..512].copy_from_slice(h.as_bytes());
            assert!(unpack_tar(&raw[..], &dest, "x", None).is_err(), "{bad}");
        }
        assert!(!out.path().join("evil").exists());
    }

    // -- Crafted streams: what a hostile sandbox can send to the host. --

    /// One entry of a crafted stream.
    enum E<'a> {
        Dir(&'a str, u32),
        File(&'a str, u32, &'a [u8]),
        Sym(&'a str, &'a Path),
        Hard(&'a str, &'a Path),
    }

    fn stream(entries: &[E<'_>]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mtime(1_600_000_000);
            match e {
                E::Dir(name, mode) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    b.append_data(&mut h, name, std::io::empty()).expect("dir");
                }
                E::File(name, mode, data) => {
                    h.set_mode(*mode);
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, name, *data).expect("file");
                }
                E::Sym(name, target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, name, target).expect("symlink");
                }
                E::Hard(name, target) => {
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_mode(0o644);
                    h.set_size(0);
                    b.append_link(&mut h, name, target).expect("hard link");
                }
            }
        }
        b.into_inner().expect("tar")
    }

    /// A temp dir with `dest/` (where streams land) and, outside it,
    /// `decoy/file` (mode 0644) that no stream may touch.
    struct Scene {
        t: tempfile::TempDir,
    }

    const DECOY: &[u8] = b"decoy, never to be changed";

    impl Scene {
        fn new() -> Scene {
            let t = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir(t.path().join("dest")).expect("mkdir");
            std::fs::create_dir(t.path().join("decoy")).expect("mkdir");
            std::fs::write(t.path().join("decoy/file"), DECOY).expect("write");
            std::fs::set_permissions(
                t.path().join("decoy/file"),
                std::fs::Permissions::from_mode(0o644),
            )
            .expect("chmod");
            Scene { t }
        }
        fn dest(&self) -> PathBuf {
            self.t.path().join("dest")
        }
        fn decoy_dir(&self) -> PathBuf {
            self.t.path().join("decoy")
        }
        fn decoy(&self) -> PathBuf {
            self.t.path().join("decoy/file")
        }
        /// Unpacks as a download to the host does.
        fn download(&self, data: &[u8]) -> std::io::Result<()> {
            unpack_to_host(data, &self.dest(), "x", SetId::Strip)
        }
        /// The decoy is as it was: content, mode, one link, alone in its dir.
        #[track_caller]
        fn assert_decoy_intact(&self) {
            let md = std::fs::symlink_metadata(self.decoy()).expect("decoy");
            assert_eq!(md.mode() & 0o7777, 0o644, "decoy mode changed");
            assert_eq!(md.nlink(), 1, "decoy got a hard link");
            assert_eq!(std::fs::read(self.decoy()).expect("read"), DECOY);
            let names: Vec<_> = std::fs::read_dir(self.decoy_dir())
                .expect("ls")
                .map(|e| e.expect("entry").file_name())
                .collect();
            assert_eq!(names, vec![OsString::from("file")], "decoy dir changed");
        }
    }

    #[track_caller]
    fn assert_refused(r: std::io::Result<()>, entry: &str) {
        let e = r.expect_err("the stream was unpacked");
        assert!(
            e.to_string().contains(&format!("archive entry {entry}")),
            "the error does not name {entry}: {e}"
        );
    }

    #[test]
    fn dir_then_symlink_of_the_same_name_is_refused() {
        let s = Scene::new();
        let decoy_dir = s.decoy_dir();
        let data = stream(&[
            E::Dir("x", 0o755),
            E::Dir("x/d", 0o755),
            E::Sym("x/d", &decoy_dir),
            E::File("x/d/pwned", 0o644, b"evil"),
        ]);
        assert_refused(s.download(&data), "x/d");
        s.assert_decoy_intact();
        // A refused stream leaves nothing of what it made.
        assert!(!s.dest().join("x").exists());
    }

    #[test]
    fn symlink_then_dir_of_the_same_name_is_refused() {
        let s = Scene::new();
        // The link leads back inside, so that a walk that follows it would
        // not notice: the entry must be refused for its changed type.
        let data = stream(&[
            E::Dir("x", 0o755),
            E::Sym("x/d", Path::new(".")),
            E::Dir("x/d", 0o755),
            E::File("x/d/f", 0o644, b"through"),
        ]);
        assert_refused(s.download(&data), "x/d");
        assert!(!s.dest().join("x/f").exists(), "written through x/d");
        s.assert_decoy_intact();
    }

    #[test]
    fn files_never_go_through_a_symlink_to_a_decoy() {
        let s = Scene::new();
        let (decoy_dir, decoy) = (s.decoy_dir(), s.decoy());
        // A file below a symlink to the decoy's directory.
        let data = stream(&[
            E::Dir("x", 0o755),
            E::Sym("x/esc", &decoy_dir),
            E::File("x/esc/pwned", 0o644, b"evil"),
        ]);
        assert_refused(s.download(&data), "x/esc/pwned");
        s.assert_decoy_intact();
        // A file of the same name as a symlink to the decoy.
        let data = stream(&[
            E::Dir("x", 0o755),
            E::Sym("x/l", &decoy),
            E::File("x/l", 0o4755, b"evil"),
        ]);
        assert_refused(s.download(&data), "x/l");
        s.assert_decoy_intact();
        // One already in the destination is not followed either.
        let s = Scene::new();
        std::fs::create_dir(s.dest().join("x")).expect("mkdir");
        std::os::unix::fs::symlink(s.decoy(), s.dest().join("x/l")).expect("symlink");
        std::os::unix::fs::symlink(s.decoy_dir(), s.dest().join("x/esc")).expect("symlink");
        let data = stream(&[E::File("x/l", 0o4755, b"evil")]);
        s.download(&data).expect("a file replaces the symlink");
        assert_eq!(std::fs::read(s.dest().join("x/l")).expect("read"), b"evil");
        let data = stream(&[E::File("x/esc/pwned", 0o644, b"evil")]);
        assert_refused(s.download(&data), "x/esc/pwned");
        let data = stream(&[E::Dir("x/esc", 0o4755)]);
        assert_refused(s.download(&data), "x/esc");
        s.assert_decoy_intact();
    }

    /// A directory's mode is applied at the end; by then its name may be a
    /// symlink (here through a second one, made harmless-looking when the
    /// directory entry came): the mode must never reach the decoy.
    #[test]
    fn dir_modes_never_reach_through_a_symlink() {
        let s = Scene::new();
        let decoy = s.decoy();
        let data = stream(&[
            E::Dir("x", 0o755),
            E::Sym("x/e", Path::new(".")),
            E::Sym("x/d", Path::new("e")),
            E::Dir("x/d", 0o4755),
            E::Sym("x/e", &decoy),
        ]);
        let r = s.download(&data);
        s.assert_decoy_intact();
        assert_refused(r, "x/d");
    }

    #[test]
    fn hard_links_only_to_regular_files_written_before() {
        let s = Scene::new();
        let outside = format!("{}/../decoy/file", s.dest().display());
        std::fs::create_dir(s.dest().join("x")).expect("mkdir");
        std::fs::write(s.dest().join("x/pre"), "already there").expect("write");
        let decoy = s.decoy();
        let cases: Vec<(&str, Vec<E<'_>>)> = vec![
            (
                "climbs out",
                vec![E::Hard("x/h", Path::new("x/../../decoy/file"))],
            ),
            ("absolute", vec![E::Hard("x/h", &decoy)]),
            (
                "absolute with ..",
                vec![E::Hard("x/h", Path::new(&outside))],
            ),
            (
                "to a later entry",
                vec![
                    E::Hard("x/h", Path::new("x/later")),
                    E::File("x/later", 0o644, b"later"),
                ],
            ),
            (
                "to a file not from this stream",
                vec![E::Hard("x/h", Path::new("x/pre"))],
            ),
            (
                "to a symlink of this stream",
                vec![E::Sym("x/s", &decoy), E::Hard("x/h", Path::new("x/s"))],
            ),
            (
                "to a directory of this stream",
                vec![E::Dir("x/sub", 0o755), E::Hard("x/h", Path::new("x/sub"))],
            ),
        ];
        for (what, entries) in cases {
            let r = s.download(&stream(&entries));
            assert!(r.is_err(), "{what}: unpacked");
            assert_refused(r, "x/h");
            assert!(
                std::fs::symlink_metadata(s.dest().join("x/h")).is_err(),
                "{what}: x/h made"
            );
            s.assert_decoy_intact();
        }
        assert_eq!(
            std::fs::metadata(s.dest().join("x/pre"))
                .expect("pre")
                .nlink(),
            1
        );
        // To a file written before: one inode.
        let data = stream(&[
            E::File("x/f", 0o640, b"shared"),
            E::Hard("x/h", Path::new("x/f")),
        ]);
        s.download(&data)
            .expect("a hard link to a file of the stream");
        let (f, h) = (
            std::fs::metadata(s.dest().join("x/f")).expect("f"),
            std::fs::metadata(s.dest().join("x/h")).expect("h"),
        );
        assert_eq!((f.ino(), f.nlink()), (h.ino(), 2));
    }

    #[test]
    fn setid_bits_are_dropped_on_the_host_unless_kept() {
        let data = stream(&[
            E::Dir("x", 0o2755),
            E::File("x/suid", 0o4755, b"#!/bin/sh\n"),
            E::File("x/sgid", 0o2711, b"#!/bin/sh\n"),
            E::File("x/sticky", 0o1777, b""),
        ]);
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;
        for (setid, want) in [
            (SetId::Strip, [0o755, 0o755, 0o711, 0o1777]),
            (SetId::Keep, [0o2755, 0o4755, 0o2711, 0o1777]),
        ] {
            let out = tempfile::tempdir().expect("tempdir");
            unpack_to_host(&data[..], out.path(), "x", setid).expect("unpack");
            let d = out.path().join("x");
            let got = [
                mode(&d),
                mode(&d.join("suid")),
                mode(&d.join("sgid")),
                mode(&d.join("sticky")),
            ];
            assert_eq!(got, want, "{setid:?}");
        }
        // The sandbox side of an upload keeps them, also for another owner.
        let out = tempfile::tempdir().expect("tempdir");
        let me = (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        );
        unpack_tar(&data[..], out.path(), "x", Some(me)).expect("unpack");
        assert_eq!(mode(&out.path().join("x/suid")), 0o4755);
    }

    /// A name below the source that is swapped for a symlink to a decoy (a
    /// file, and a directory) while the tree is archived, again and again:
    /// the decoy's content never gets into an archive.
    #[test]
    fn write_tar_never_follows_a_name_swapped_for_a_symlink() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        const MARKER: &[u8] = b"decoy-marker-8c1f2e";
        let t = tempfile::tempdir().expect("tempdir");
        let (src, decoy) = (t.path().join("src"), t.path().join("decoy"));
        std::fs::create_dir_all(src.join("d")).expect("mkdir");
        std::fs::create_dir(&decoy).expect("mkdir");
        std::fs::write(decoy.join("f"), MARKER).expect("write");
        std::fs::write(src.join("f"), "benign").expect("write");
        std::fs::write(src.join("d/f"), "benign").expect("write");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flips = std::sync::Arc::new(AtomicU64::new(0));
        let flipper = {
            let (src, decoy) = (src.clone(), decoy.clone());
            let (stop, flips) = (stop.clone(), flips.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::os::unix::fs::symlink(decoy.join("f"), src.join("l"));
                    let _ = std::fs::rename(src.join("l"), src.join("f"));
                    let _ = std::fs::write(src.join("t"), "benign");
                    let _ = std::fs::rename(src.join("t"), src.join("f"));
                    let _ = std::fs::rename(src.join("d"), src.join("d.real"));
                    let _ = std::os::unix::fs::symlink(&decoy, src.join("d"));
                    let _ = std::fs::remove_file(src.join("d"));
                    let _ = std::fs::rename(src.join("d.real"), src.join("d"));
                    flips.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // Until the flipper has swapped the names many times (bounded).
        let (mut archives, mut links, mut files) = (0, 0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while (archives < 300 || flips.load(Ordering::Relaxed) < 1000)
            && std::time::Instant::now() < deadline
        {
            let mut buf = Vec::new();
            write_tar(&src, "src", &mut buf).expect("tar");
            archives += 1;
            let mut ar = tar::Archive::new(&buf[..]);
            for e in ar.entries().expect("entries") {
                let mut e = e.expect("entry");
                let path = e.path().expect("path").into_owned();
                if path == Path::new("src/f") {
                    if e.header().entry_type().is_symlink() {
                        links += 1;
                    } else {
                        files += 1;
                    }
                }
                let mut data = Vec::new();
                e.read_to_end(&mut data).expect("read");
                assert!(
                    !data.windows(MARKER.len()).any(|w| w == MARKER),
                    "{} carries the decoy's content",
                    path.display()
                );
            }
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        flipper.join().expect("flipper");
        let flips = flips.load(Ordering::Relaxed);
        eprintln!("{archives} archives, {flips} flips; src/f a symlink {links}, a file {files}");
        assert!(links > 0 && files > 0, "the race never happened");
    }

    // -- retar: a sandbox's stream passed on to stdout (`cp NAME:/path -`). --

    /// The names, types and modes of a tar stream's entries.
    fn entries_of(data: &[u8]) -> Vec<(String, char, u32)> {
        let mut ar = tar::Archive::new(data);
        ar.entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                let h = e.header();
                let kind = match h.entry_type() {
                    tar::EntryType::Directory => 'd',
                    tar::EntryType::Symlink => 'l',
                    tar::EntryType::Link => 'h',
                    _ => 'f',
                };
                let name = e.path().expect("path").display().to_string();
                (name, kind, h.mode().expect("mode") & 0o7777)
            })
            .collect()
    }

    fn retarred(data: &[u8], setid: SetId) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        retar(data, "x", setid, &mut out)?;
        Ok(out)
    }

    #[test]
    fn retar_passes_on_a_plain_tree_and_drops_setid_unless_kept() {
        let data = stream(&[
            E::Dir("x", 0o2755),
            E::File("x/suid", 0o4755, b"#!/bin/sh\n"),
            E::Dir("x/sub", 0o710),
            E::File("x/sub/f", 0o604, b"data"),
            E::Sym("x/l", Path::new("/etc/shadow")),
            E::Hard("x/h", Path::new("x/sub/f")),
        ]);
        let plain = |m: u32| m & !0o6000;
        let got = entries_of(&retarred(&data, SetId::Strip).expect("retar"));
        assert_eq!(
            got,
            vec![
                ("x".into(), 'd', plain(0o2755)),
                ("x/suid".into(), 'f', plain(0o4755)),
                ("x/sub".into(), 'd', 0o710),
                ("x/sub/f".into(), 'f', 0o604),
                ("x/l".into(), 'l', 0o777),
                ("x/h".into(), 'h', 0o644),
            ]
        );
        let kept = entries_of(&retarred(&data, SetId::Keep).expect("retar"));
        assert_eq!(kept[0].2, 0o2755);
        assert_eq!(kept[1].2, 0o4755);
        // Data, link targets and times come through; it unpacks as sent.
        let out = tempfile::tempdir().expect("tempdir");
        let copy = retarred(&data, SetId::Keep).expect("retar");
        unpack_to_host(&copy[..], out.path(), "x", SetId::Keep).expect("unpack");
        let x = out.path().join("x");
        assert_eq!(std::fs::read(x.join("sub/f")).expect("read"), b"data");
        assert_eq!(std::fs::read(x.join("h")).expect("read"), b"data");
        assert_eq!(
            std::fs::read_link(x.join("l")).expect("readlink"),
            Path::new("/etc/shadow")
        );
        let md = std::fs::metadata(x.join("suid")).expect("stat");
        assert_eq!((md.mode() & 0o7777, md.mtime()), (0o4755, 1_600_000_000));
    }

    #[test]
    fn retar_refuses_what_a_download_refuses() {
        let cases: Vec<(&str, Vec<E<'_>>, &str)> = vec![
            ("another top name", vec![E::File("y/f", 0o644, b"")], "y/f"),
            (
                "below a symlink it sent",
                vec![
                    E::Dir("x", 0o755),
                    E::Sym("x/esc", Path::new("/")),
                    E::File("x/esc/etc/passwd", 0o644, b"evil"),
                ],
                "x/esc/etc/passwd",
            ),
            (
                "below a file it sent",
                vec![E::File("x/f", 0o644, b""), E::File("x/f/g", 0o644, b"")],
                "x/f/g",
            ),
            (
                "a dir, then a symlink of its name",
                vec![E::Dir("x/d", 0o755), E::Sym("x/d", Path::new("/etc"))],
                "x/d",
            ),
            (
                "a hard link out",
                vec![E::Hard("x/h", Path::new("x/../../etc/passwd"))],
                "x/h",
            ),
            (
                "a hard link to a file not sent",
                vec![E::Hard("x/h", Path::new("x/later"))],
                "x/h",
            ),
            (
                "a hard link to a symlink",
                vec![
                    E::Sym("x/s", Path::new("/etc/passwd")),
                    E::Hard("x/h", Path::new("x/s")),
                ],
                "x/h",
            ),
        ];
        for (what, entries, entry) in cases {
            let r = retarred(&stream(&entries), SetId::Keep).map(drop);
            assert!(r.is_err(), "{what}: passed on");
            assert_refused(r, entry);
        }
        // Names the tar crate will not write: `..` and absolute ones.
        for bad in ["x/../../etc/passwd", "/etc/passwd", "../x"] {
            let mut raw = vec![0u8; 1024 + 512];
            let mut h = tar::Header::new_old();
            h.set_size(0);
            h.set_mode(0o644);
            h.as_old_mut().name[..bad.len()].copy_from_slice(bad.as_bytes());
            h.set_cksum();
            raw[..512].copy_from_slice(h.as_bytes());
            assert_refused(retarred(&raw, SetId::Keep).map(drop), bad);
        }
    }

    /// A tree with a 64 MiB file holding 8 KiB of data, archived.
    fn sparse_tree() -> (tempfile::TempDir, Vec<u8>) {
        use std::os::unix::fs::FileExt;
        let t = tempfile::tempdir().expect("tempdir");
        let src = t.path().join("src");
        std::fs::create_dir(&src).expect("mkdir");
        let f = File::create(src.join("sparse")).expect("create");
        f.write_all_at(&[1u8; 4096], 0).expect("write");
        f.write_all_at(&[2u8; 4096], 40 << 20).expect("write");
        f.set_len(64 << 20).expect("truncate");
        std::fs::write(src.join("plain"), "plain").expect("write");
        let mut data = Vec::new();
        write_tar(&src, "src", &mut data).expect("tar");
        (t, data)
    }

    #[test]
    fn sparse_files_keep_their_holes_through_download_and_retar() {
        let (t, data) = sparse_tree();
        if data.len() > 1 << 20 {
            eprintln!("skipped: the temp dir's file system reports no holes");
            return;
        }
        let mut again = Vec::new();
        retar(&data[..], "src", SetId::Strip, &mut again).expect("retar");
        assert!(again.len() < 1 << 20, "retar sent {} bytes", again.len());
        for (i, stream) in [&data, &again].into_iter().enumerate() {
            let out = t.path().join(format!("out{i}"));
            std::fs::create_dir(&out).expect("mkdir");
            unpack_to_host(&stream[..], &out, "src", SetId::Strip).expect("unpack");
            let got = out.join("src/sparse");
            let md = std::fs::metadata(&got).expect("stat");
            assert_eq!(md.len(), 64 << 20);
            assert!(md.blocks() < 1024, "{} blocks", md.blocks());
            assert_eq!(
                std::fs::read(&got).expect("read"),
                std::fs::read(t.path().join("src/sparse")).expect("read")
            );
        }
    }

    #[test]
    fn a_download_past_its_limits_fails_and_leaves_nothing() {
        let (t, data) = sparse_tree();
        for limits in [
            Limits {
                max_bytes: 4096,
                max_entries: 100,
            },
            Limits {
                max_bytes: 1 << 30,
                max_entries: 2,
            },
        ] {
            let out = t.path().join("out");
            std::fs::create_dir(&out).expect("mkdir");
            let e = unpack_to_host_limited(&data[..], &out, "src", SetId::Strip, limits)
                .expect_err("past the limit");
            assert!(LimitExceeded::find(&e).is_some(), "{e}");
            assert_eq!(
                std::fs::read_dir(&out).expect("ls").count(),
                0,
                "left behind"
            );
            std::fs::remove_dir(&out).expect("rmdir");
            let e = retar_limited(&data[..], "src", SetId::Strip, limits, std::io::sink())
                .expect_err("past the limit");
            assert!(LimitExceeded::find(&e).is_some(), "{e}");
        }
    }

    #[test]
    fn retar_leaves_out_fifos_and_devices() {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind) in [
            ("x", tar::EntryType::Directory),
            ("x/null", tar::EntryType::Char),
            ("x/disk", tar::EntryType::Block),
            ("x/fifo", tar::EntryType::Fifo),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(0o666);
            h.set_size(0);
            b.append_data(&mut h, name, std::io::empty())
                .expect("entry");
        }
        let data = b.into_inner().expect("tar");
        let got = entries_of(&retarred(&data, SetId::Keep).expect("retar"));
        assert_eq!(got, vec![("x".into(), 'd', 0o666)]);
    }

    #[test]
    fn extract_into_needs_a_directory_and_stays_in_it() {
        let s = Scene::new();
        let data = stream(&[E::Dir("a", 0o750), E::File("a/f", 0o4755, b"kept")]);
        extract_into(&data[..], &s.dest(), None).expect("extract");
        let md = std::fs::metadata(s.dest().join("a/f")).expect("stat");
        assert_eq!(md.mode() & 0o7777, 0o4755, "uploads keep setuid");
        let missing = s.dest().join("missing");
        let e = extract_into(&data[..], &missing, None).expect_err("no dir");
        assert!(e.to_string().contains("no such directory"), "{e}");
        assert!(!missing.exists());
        let e = extract_into(&data[..], &s.dest().join("a/f"), None).expect_err("a file");
        assert!(e.to_string().contains("not a directory"), "{e}");
        let decoy_dir = s.decoy_dir();
        for entries in [
            vec![
                E::Sym("esc", &decoy_dir),
                E::File("esc/pwned", 0o644, b"evil"),
            ],
            vec![E::Hard("h", Path::new("../decoy/file"))],
        ] {
            assert!(extract_into(&stream(&entries)[..], &s.dest(), None).is_err());
            s.assert_decoy_intact();
        }
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// Names from a small alphabet, so that entries collide, nest
        /// and climb: `x`, `x/a`, `x/a/..`, `x/b`, `y`, `/x`...
        fn name() -> impl Strategy<Value = String> {
            let part = prop_oneof![Just("a"), Just("b"), Just(".."), Just("."), Just("")];
            (
                prop_oneof![Just("x"), Just("y"), Just("/x"), Just("..")],
                proptest::collection::vec(part, 0..4),
            )
                .prop_map(|(top, rest)| {
                    let mut n = top.to_string();
                    for p in rest {
                        n.push('/');
                        n.push_str(p);
                    }
                    n
                })
        }

        /// One raw entry: (name, kind 0 file / 1 dir / 2 symlink / 3 hard
        /// link, link target, mode).
        fn entry() -> impl Strategy<Value = (String, u8, String, u32)> {
            (
                name(),
                0u8..4,
                prop_oneof![name(), Just("/".to_string()), Just("../decoy".to_string())],
                0u32..0o10000,
            )
        }

        /// A stream of `entries` with their names written raw (the tar
        /// crate refuses to write `..`).
        fn raw_stream(entries: &[(String, u8, String, u32)]) -> Vec<u8> {
            let mut out = Vec::new();
            for (name, kind, target, mode) in entries {
                let mut h = tar::Header::new_old();
                h.set_mode(*mode);
                h.set_mtime(1_600_000_000);
                let data: &[u8] = if *kind == 0 { b"data" } else { b"" };
                h.set_size(data.len() as u64);
                h.set_entry_type(match kind {
                    0 => tar::EntryType::Regular,
                    1 => tar::EntryType::Directory,
                    2 => tar::EntryType::Symlink,
                    _ => tar::EntryType::Link,
                });
                let n = name.as_bytes();
                let t = target.as_bytes();
                h.as_old_mut().name[..n.len().min(99)].copy_from_slice(&n[..n.len().min(99)]);
                if *kind >= 2 {
                    h.as_old_mut().linkname[..t.len().min(99)]
                        .copy_from_slice(&t[..t.len().min(99)]);
                }
                h.set_cksum();
                out.extend_from_slice(h.as_bytes());
                out.extend_from_slice(data);
                out.resize(out.len().div_ceil(512) * 512, 0);
            }
            out.resize(out.len() + 1024, 0);
            out
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever a sandbox sends, retar passes on only a stream that
            /// a download unpacks, with nothing outside the destination
            /// touched, no setuid bit, and no entry below a link.
            #[test]
            fn what_retar_passes_on_unpacks_inside(
                entries in proptest::collection::vec(entry(), 0..8)
            ) {
                let data = raw_stream(&entries);
                let mut out = Vec::new();
                if retar(&data[..], "x", SetId::Strip, &mut out).is_ok() {
                    let s = Scene::new();
                    let mut names = Vec::new();
                    for (name, _, mode) in entries_of(&out) {
                        prop_assert!(mode & 0o6000 == 0, "{name}: setid bits");
                        prop_assert!(
                            name == "x" || name.starts_with("x/"),
                            "{name}: not below x"
                        );
                        prop_assert!(
                            !name.split('/').any(|c| c == ".."),
                            "{name}: climbs"
                        );
                        names.push(name);
                    }
                    // A download of it may fail (a type clash with what
                    // the destination has), but never reaches outside.
                    let _ = unpack_to_host(&out[..], &s.dest(), "x", SetId::Strip);
                    s.assert_decoy_intact();
                }
            }

            /// Arbitrary bytes: an error or a stream, never a panic.
            #[test]
            fn retar_takes_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
                let mut out = Vec::new();
                let _ = retar(&data[..], "x", SetId::Strip, &mut out);
            }
        }
    }
}
