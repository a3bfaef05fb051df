//! Unpacking a tar stream into a directory, on the host or in a sandbox:
//! every parent reached from the destination's fd ([`beneath::reach_dir`]),
//! entries made with `*at()` calls, what the stream wrote remembered (see
//! the module's note in `transfer`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid, CWD};
use rustix::io::Errno;
use sifbox_sys::beneath;

use super::sparse;
use super::{LimitExceeded, Limits, SetId};

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
    unpack_relative(input, root, owner)
}

/// The unpacking of a stream of relative names into `root`, setuid and
/// setgid bits kept, unlimited (what the caller sends is its own).
fn unpack_relative(
    input: impl Read,
    root: OwnedFd,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
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
    unpack_relative(input, root, owner)
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
        let Some(new) = Written::of(kind, raw) else {
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
    /// What an entry of `kind` writes (a file's inode yet unknown); `None`
    /// for a special file, which is left out.
    fn of(kind: tar::EntryType, raw: &Path) -> Option<Self> {
        if kind.is_dir() {
            Some(Written::Dir)
        } else if kind.is_symlink() {
            Some(Written::Symlink)
        } else if kind.is_hard_link() || kind.is_file() || kind == tar::EntryType::Continuous {
            Some(Written::File { dev: 0, ino: 0 })
        } else {
            tracing::debug!("leaving out special file {}", raw.display());
            None
        }
    }

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
            let Ok(dir) = beneath::reach_dir(&self.root, &parent, None) else {
                continue;
            };
            let st = rustix::fs::statat(&dir, &file, AtFlags::SYMLINK_NOFOLLOW);
            let flags = match st {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    // Its mode may forbid removing what is in it.
                    if let Ok(d) = beneath::open_subdir(&dir, &file) {
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
        let Some(new) = Written::of(kind, raw) else {
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
            let pdir = beneath::reach_dir(&self.root, &parent, Some(&mut self.created))?;
            if beneath::make_dir(&pdir, &file, Mode::from_raw_mode(0o700))? {
                self.created.push(rel.clone());
            }
            let dir = beneath::open_subdir(&pdir, &file)?;
            if let Some((uid, gid)) = self.owner {
                rustix::fs::chownat(&dir, "", ids(uid), gids(gid), AtFlags::EMPTY_PATH)?;
            }
            self.written.insert(rel.clone(), Written::Dir);
            self.dirs.insert(rel, (mode.as_raw_mode(), mtime));
            return Ok(());
        }
        let dir = beneath::reach_dir(&self.root, &parent, None)?;
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
            let tdir = beneath::reach_dir(&self.root, &tparent, None)?;
            beneath::clear(&dir, &file)?;
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
        beneath::clear(&dir, &file)?;
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
                let pdir = beneath::reach_dir(&self.root, &parent, None)?;
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let dir = rustix::fs::openat(&pdir, &file, flags, Mode::empty())
                    .map_err(beneath::not_a_dir)?;
                beneath::is_dir(&dir)?;
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
fn split(rel: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    let file = rel
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("bad entry {}", rel.display())))?;
    let parent = rel.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok((parent, PathBuf::from(file)))
}
