//! Confined application of tar entries onto a directory handle.
//!
//! Parent directories are resolved with `cap_std::fs::Dir::open_dir` from the
//! target's handle (which refuses to leave it); the last component is then
//! handled with `*at` calls on that parent's descriptor, with one validated
//! name and never following a symlink.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;

use cap_std::fs::Dir;
use rustix::fs::{self as rfs, AtFlags, FileType, Gid, Mode, OFlags, Uid, XattrFlags};
use rustix::io::Errno;
use sifbox_sys::beneath;

use super::tarstream::{Entry, Kind, TarReader};
use super::{ApplyOptions, DeviceKind, DeviceNode, Devices, Error, LayerReport, Owners, Result};

const COPY_BUF: usize = 128 * 1024;

/// Applies every entry of an uncompressed tar stream.
pub(crate) fn apply_tar<R: Read>(tar: R, dest: &Dir, opts: &ApplyOptions) -> Result<LayerReport> {
    let mut reader = TarReader::new(tar);
    let mut applier = Applier::new(dest, opts);
    while let Some(entry) = reader.next_entry()? {
        applier.apply(&entry, &mut reader)?;
    }
    applier.finish()
}

/// Normalises a tar name lexically into its components: `.` and empty ones
/// dropped, `..` applied. Absolute names and `..` that climbs out of the
/// target are refused.
pub(crate) fn normalize(raw: &[u8]) -> std::result::Result<Vec<&[u8]>, &'static str> {
    if raw.is_empty() {
        return Err("empty name");
    }
    if raw.contains(&0) {
        return Err("name contains a NUL byte");
    }
    if raw[0] == b'/' {
        // Some writers (umoci) name the root `/`: that one is `./`.
        if raw.iter().all(|b| *b == b'/') {
            return Ok(Vec::new());
        }
        return Err("absolute path");
    }
    let mut out: Vec<&[u8]> = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err("`..` climbs out of the target directory");
                }
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

fn join(comps: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, c) in comps.iter().enumerate() {
        if i > 0 {
            out.push(b'/');
        }
        out.extend_from_slice(c);
    }
    out
}

fn child_key(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() {
        name.to_vec()
    } else {
        let mut k = parent.to_vec();
        k.push(b'/');
        k.extend_from_slice(name);
        k
    }
}

fn rel_path(key: &[u8]) -> &Path {
    if key.is_empty() {
        Path::new(".")
    } else {
        Path::new(OsStr::from_bytes(key))
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn errno(e: &io::Error) -> Option<Errno> {
    Errno::from_io_error(e)
}

/// cap-std reports a resolution that would leave the directory as a
/// `PermissionDenied` error without an OS code (or the kernel's `EXDEV`
/// from `openat2(RESOLVE_BENEATH)`).
fn is_escape(e: &io::Error) -> bool {
    (e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none())
        || errno(e) == Some(Errno::XDEV)
}

fn is_dir(st: &rfs::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

/// `fchmod`, also for `O_PATH` descriptors (cap-std's directory handles,
/// [`beneath::open_dir_path`]), through their `/proc/self/fd` link: that reaches the
/// very inode the descriptor holds, even without search permission on it.
fn chmod_fd<Fd: AsFd>(fd: Fd, mode: Mode) -> rustix::io::Result<()> {
    let fd = fd.as_fd();
    match rfs::fchmod(fd, mode) {
        Err(Errno::BADF) => rfs::chmod(format!("/proc/self/fd/{}", fd.as_raw_fd()), mode),
        other => other,
    }
}

fn dir_from_fd(fd: OwnedFd) -> Dir {
    Dir::from_std_file(std::fs::File::from(fd))
}

/// Names in a directory, `.` and `..` left out. (cap-std's handles may be
/// `O_PATH` descriptors, which cannot be read: the directory is reopened.)
pub(crate) fn list_names<Fd: AsFd>(dir: Fd) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    let fd = rfs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut reader = rfs::Dir::new(fd)?;
    while let Some(ent) = reader.read() {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    Ok(names)
}

/// Removes `name` in `dir` and, for a directory, everything below it,
/// without following symlinks and giving the owner access to directories
/// that lack it.
pub(crate) fn remove_tree<Fd: AsFd>(dir: Fd, name: &[u8]) -> io::Result<()> {
    let dir = dir.as_fd();
    let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if !is_dir(&st) {
        return Ok(rfs::unlinkat(dir, name, AtFlags::empty())?);
    }
    {
        let sub = beneath::open_dir_path(dir, name)?;
        let mode = Mode::from_raw_mode(st.st_mode);
        if !mode.contains(Mode::RWXU) {
            chmod_fd(&sub, mode | Mode::RWXU)?;
        }
        for child in list_names(&sub)? {
            remove_tree(&sub, &child)?;
        }
    }
    Ok(rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

/// Metadata of a directory, applied when the layer is complete.
#[derive(Debug)]
struct DirMeta {
    key: Vec<u8>,
    depth: usize,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: i64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Applies the entries of one layer. Call [`Applier::finish`] at the end.
#[derive(Debug)]
pub(crate) struct Applier<'d> {
    root: &'d Dir,
    opts: ApplyOptions,
    privileged: bool,
    /// Every path this layer wrote: whiteouts leave them alone.
    created: BTreeSet<Vec<u8>>,
    dirs: Vec<DirMeta>,
    /// Directories given owner rwx to write into them, with their mode.
    loosened: BTreeMap<Vec<u8>, u32>,
    devices: Vec<DeviceNode>,
    cache: Option<(Vec<u8>, Rc<Dir>)>,
    buf: Vec<u8>,
    entries: u64,
}

impl<'d> Applier<'d> {
    pub fn new(root: &'d Dir, opts: &ApplyOptions) -> Self {
        Applier {
            root,
            opts: opts.clone(),
            privileged: rustix::process::geteuid().is_root(),
            created: BTreeSet::new(),
            dirs: Vec::new(),
            loosened: BTreeMap::new(),
            devices: Vec::new(),
            cache: None,
            buf: Vec::new(),
            entries: 0,
        }
    }

    /// Applies one entry; `body` reads its content.
    pub fn apply<R: Read>(&mut self, e: &Entry, body: &mut R) -> Result<()> {
        self.entries += 1;
        let entry = e.display();
        let comps = normalize(&e.path).map_err(|reason| Error::Rejected {
            entry: entry.clone(),
            reason: reason.into(),
        })?;
        let Some((&name, parent)) = comps.split_last() else {
            // `./`: the target directory itself.
            if e.kind == Kind::Dir {
                self.dirs.push(DirMeta::new(Vec::new(), 0, e));
                return Ok(());
            }
            return Err(Error::Rejected {
                entry,
                reason: "names the target directory itself".into(),
            });
        };
        if let Some(target) = name.strip_prefix(b".wh.") {
            if target == b".wh..opq" {
                return self.opaque(parent, &entry);
            }
            if target.starts_with(b".wh.") {
                // aufs metadata (`.wh..wh.plnk` and the like): nothing to do.
                return Ok(());
            }
            if target.is_empty() || target == b"." || target == b".." {
                return Err(Error::Rejected {
                    entry,
                    reason: "whiteout of an empty name, `.` or `..`".into(),
                });
            }
            return self.whiteout(parent, target, &entry);
        }
        let key = join(&comps);
        match e.kind {
            Kind::Dir => self.make_dir(parent, name, &key, comps.len(), e, &entry)?,
            Kind::File => self.make_file(parent, name, e, body, &entry)?,
            Kind::Symlink => self.make_symlink(parent, name, e, &entry)?,
            Kind::HardLink => self.make_hard_link(parent, name, &key, e, &entry)?,
            Kind::Fifo => self.make_node(parent, name, e, FileType::Fifo, 0, &entry)?,
            Kind::Char | Kind::Block => self.make_device(parent, name, &key, e, body, &entry)?,
        }
        self.created.insert(key);
        Ok(())
    }

    /// Applies directory metadata and restores loosened directories,
    /// deepest first (so that a parent losing its search permission does
    /// not hide a child not yet done).
    pub fn finish(mut self) -> Result<LayerReport> {
        self.cache = None;
        let metas = std::mem::take(&mut self.dirs);
        let with_meta: BTreeSet<&[u8]> = metas.iter().map(|d| d.key.as_slice()).collect();
        let depth = |k: &[u8]| {
            if k.is_empty() {
                0
            } else {
                1 + k.iter().filter(|b| **b == b'/').count()
            }
        };
        let mut work: Vec<(usize, &[u8], Option<&DirMeta>, u32)> = metas
            .iter()
            .map(|d| (d.depth, d.key.as_slice(), Some(d), d.mode))
            .chain(
                self.loosened
                    .iter()
                    .filter(|(k, _)| !with_meta.contains(k.as_slice()))
                    .map(|(k, mode)| (depth(k), k.as_slice(), None, *mode)),
            )
            .collect();
        work.sort_by_key(|w| std::cmp::Reverse(w.0));
        for (_, key, meta, mode) in work {
            let Some(fd) = self.open_existing_dir(key) else {
                continue;
            };
            let entry = if key.is_empty() {
                ".".to_string()
            } else {
                lossy(key)
            };
            match meta {
                Some(d) => {
                    self.set_owner_fd(&fd, d.uid, d.gid, &entry)?;
                    rfs::fchmod(&fd, Mode::from_raw_mode(d.mode))
                        .map_err(|e| entry_err(&entry, "set the mode", e))?;
                    self.set_xattrs(&fd, &d.xattrs, &entry)?;
                    set_times_fd(&fd, d.mtime, &entry)?;
                }
                None => rfs::fchmod(&fd, Mode::from_raw_mode(mode))
                    .map_err(|e| entry_err(&entry, "restore the mode", e))?,
            }
        }
        Ok(LayerReport {
            entries: self.entries,
            devices: std::mem::take(&mut self.devices),
        })
    }

    /// Opens the directory at `key` for reading if it is still one (not
    /// following a symlink in its last component), first giving its owner
    /// access when it has none; `None` when there is no directory there.
    fn open_existing_dir(&self, key: &[u8]) -> Option<OwnedFd> {
        let path = if key.is_empty() {
            beneath::open_dir_path(self.root, c".").ok()?
        } else {
            let (parent, name) = match key.iter().rposition(|b| *b == b'/') {
                Some(i) => (&key[..i], &key[i + 1..]),
                None => (&b""[..], key),
            };
            let dir = self.root.open_dir(rel_path(parent)).ok()?;
            beneath::open_dir_path(&dir, name).ok()?
        };
        let reopen = || {
            rfs::openat(
                &path,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
        };
        match reopen() {
            Ok(fd) => Some(fd),
            Err(Errno::ACCESS) => {
                let mode = Mode::from_raw_mode(rfs::fstat(&path).ok()?.st_mode);
                chmod_fd(&path, mode | Mode::RWXU).ok()?;
                reopen().ok()
            }
            Err(_) => None,
        }
    }

    /// Gives the owner rwx on `dir` (remembering its mode) when an
    /// unprivileged caller could not write into it otherwise.
    fn loosen(&mut self, dir: &Dir, key: &[u8], entry: &str) -> Result<()> {
        if self.privileged {
            return Ok(());
        }
        let st =
            rfs::fstat(dir).map_err(|e| entry_err(entry, "inspect its parent directory", e))?;
        let mode = Mode::from_raw_mode(st.st_mode);
        if !mode.contains(Mode::RWXU) {
            self.loosened.entry(key.to_vec()).or_insert(mode.bits());
            chmod_fd(dir, mode | Mode::RWXU)
                .map_err(|e| entry_err(entry, "make its parent directory writable", e))?;
        }
        Ok(())
    }

    fn resolve_error(&self, e: &io::Error, key: &[u8], entry: &str) -> Error {
        if is_escape(e) {
            Error::Rejected {
                entry: entry.to_string(),
                reason: format!(
                    "`{}` resolves outside the target directory (through a symlink)",
                    lossy(key)
                ),
            }
        } else if errno(e) == Some(Errno::LOOP) {
            Error::Rejected {
                entry: entry.to_string(),
                reason: format!("`{}`: too many levels of symlinks", lossy(key)),
            }
        } else {
            Error::Entry {
                entry: entry.to_string(),
                op: "open its parent directory",
                source: io::Error::new(e.kind(), format!("`{}`: {e}", lossy(key))),
            }
        }
    }

    /// Opens the directory at `comps` (following symlinks that stay inside
    /// the target), `None` if there is no directory there.
    fn dir_existing(&mut self, comps: &[&[u8]], entry: &str) -> Result<Option<Rc<Dir>>> {
        let key = join(comps);
        if let Some((k, d)) = &self.cache {
            if *k == key {
                return Ok(Some(Rc::clone(d)));
            }
        }
        let dir = match self.root.open_dir(rel_path(&key)) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound || errno(&e) == Some(Errno::NOTDIR) => {
                return Ok(None)
            }
            Err(e) => return Err(self.resolve_error(&e, &key, entry)),
        };
        self.loosen(&dir, &key, entry)?;
        let dir = Rc::new(dir);
        self.cache = Some((key, Rc::clone(&dir)));
        Ok(Some(dir))
    }

    /// Opens the directory at `comps`, creating what is missing (mode 0755).
    fn dir_create(&mut self, comps: &[&[u8]], entry: &str) -> Result<Rc<Dir>> {
        if let Some(d) = self.dir_existing(comps, entry)? {
            return Ok(d);
        }
        let mut cur = self
            .root
            .open_dir(".")
            .map_err(|e| entry_err_io(entry, "open the target directory", e))?;
        for i in 0..comps.len() {
            let prefix = join(&comps[..=i]);
            match self.root.open_dir(rel_path(&prefix)) {
                Ok(d) => cur = d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.loosen(&cur, &join(&comps[..i]), entry)?;
                    match rfs::mkdirat(&cur, comps[i], Mode::from_raw_mode(0o755)) {
                        Ok(()) => {}
                        Err(Errno::EXIST) => {
                            return Err(Error::Rejected {
                                entry: entry.to_string(),
                                reason: format!(
                                    "its parent `{}` is a dangling symlink",
                                    lossy(&prefix)
                                ),
                            })
                        }
                        Err(e) => return Err(entry_err(entry, "create a parent directory", e)),
                    }
                    let fd = beneath::open_dir(&cur, comps[i])
                        .map_err(|e| entry_err(entry, "open a parent directory", e))?;
                    rfs::fchmod(&fd, Mode::from_raw_mode(0o755))
                        .map_err(|e| entry_err(entry, "set a parent directory's mode", e))?;
                    cur = dir_from_fd(fd);
                }
                Err(e) => return Err(self.resolve_error(&e, &prefix, entry)),
            }
        }
        let key = join(comps);
        self.loosen(&cur, &key, entry)?;
        let dir = Rc::new(cur);
        self.cache = Some((key, Rc::clone(&dir)));
        Ok(dir)
    }

    /// Makes room for a new entry `name` in `dir`: removes what is there,
    /// except a directory when `keep_dir`. Returns whether a directory was
    /// kept.
    fn clear(&mut self, dir: &Dir, name: &[u8], keep_dir: bool, entry: &str) -> Result<bool> {
        let st = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(entry_err(entry, "inspect the existing entry", e)),
        };
        if is_dir(&st) {
            if keep_dir {
                return Ok(true);
            }
            self.cache = None;
            remove_tree(dir, name)
                .map_err(|e| entry_err_io(entry, "remove the existing directory", e))?;
        } else {
            rfs::unlinkat(dir, name, AtFlags::empty())
                .map_err(|e| entry_err(entry, "remove the existing entry", e))?;
        }
        Ok(false)
    }

    fn make_dir(
        &mut self,
        parent: &[&[u8]],
        name: &[u8],
        key: &[u8],
        depth: usize,
        e: &Entry,
        entry: &str,
    ) -> Result<()> {
        let dir = self.dir_create(parent, entry)?;
        if !self.clear(&dir, name, true, entry)? {
            rfs::mkdirat(&*dir, name, Mode::RWXU)
                .map_err(|err| entry_err(entry, "create the directory", err))?;
        }
        self.dirs.push(DirMeta::new(key.to_vec(), depth, e));
        Ok(())
    }

    fn create_file(&mut self, dir: &Dir, name: &[u8], entry: &str) -> Result<std::fs::File> {
        self.clear(dir, name, false, entry)?;
        let fd = rfs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|err| entry_err(entry, "create the file", err))?;
        Ok(std::fs::File::from(fd))
    }

    fn make_file<R: Read>(
        &mut self,
        parent: &[&[u8]],
        name: &[u8],
        e: &Entry,
        body: &mut R,
        entry: &str,
    ) -> Result<()> {
        let dir = self.dir_create(parent, entry)?;
        let mut file = self.create_file(&dir, name, entry)?;
        if self.buf.is_empty() {
            self.buf = vec![0u8; COPY_BUF];
        }
        let mut left = e.size;
        while left > 0 {
            let want = usize::try_from(left.min(COPY_BUF as u64)).unwrap_or(COPY_BUF);
            let n = match body.read(&mut self.buf[..want]) {
                Ok(0) => {
                    return Err(Error::Malformed {
                        offset: e.offset,
                        reason: format!("entry `{entry}`: body ends early"),
                    })
                }
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(Error::Malformed {
                        offset: e.offset,
                        reason: format!("entry `{entry}`: {err}"),
                    })
                }
                Err(source) => {
                    return Err(Error::Io {
                        what: format!("reading the body of layer entry `{entry}`"),
                        source,
                    })
                }
            };
            file.write_all(&self.buf[..n])
                .map_err(|err| entry_err_io(entry, "write the file", err))?;
            left -= n as u64;
        }
        self.set_meta_fd(&file, e, entry)
    }

    fn set_owner_fd<Fd: AsFd>(&self, fd: Fd, uid: u64, gid: u64, entry: &str) -> Result<()> {
        if self.opts.owners == Owners::Keep {
            let (uid, gid) = ids(uid, gid, entry)?;
            rfs::fchown(fd, Some(uid), Some(gid))
                .map_err(|e| entry_err(entry, "change the owner", e))?;
        }
        Ok(())
    }

    fn set_meta_fd<Fd: AsFd>(&self, fd: Fd, e: &Entry, entry: &str) -> Result<()> {
        let fd = fd.as_fd();
        // chown before chmod: chown clears setuid and setgid.
        self.set_owner_fd(fd, e.uid, e.gid, entry)?;
        rfs::fchmod(fd, Mode::from_raw_mode(e.mode))
            .map_err(|err| entry_err(entry, "set the mode", err))?;
        self.set_xattrs(fd, &e.xattrs, entry)?;
        set_times_fd(fd, e.mtime, entry)
    }

    fn set_xattrs<Fd: AsFd>(
        &self,
        fd: Fd,
        xattrs: &[(Vec<u8>, Vec<u8>)],
        entry: &str,
    ) -> Result<()> {
        if !self.opts.xattrs {
            return Ok(());
        }
        let fd = fd.as_fd();
        for (name, value) in xattrs {
            if name.starts_with(b"trusted.") || (!self.privileged && name.starts_with(b"security."))
            {
                tracing::debug!(entry, name = %lossy(name), "extended attribute skipped");
                continue;
            }
            match rfs::fsetxattr(fd, &name[..], value, XattrFlags::empty()) {
                Ok(()) => {}
                Err(Errno::NOTSUP) => {
                    tracing::debug!(entry, name = %lossy(name), "extended attributes not supported here");
                }
                Err(err) => return Err(entry_err(entry, "set an extended attribute", err)),
            }
        }
        Ok(())
    }

    /// Owner, mode and mtime of a non-directory entry by name (fifos and
    /// device nodes, which are not opened).
    fn set_meta_at(&self, dir: &Dir, name: &[u8], e: &Entry, entry: &str) -> Result<()> {
        if self.opts.owners == Owners::Keep {
            let (uid, gid) = ids(e.uid, e.gid, entry)?;
            rfs::chownat(dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|err| entry_err(entry, "change the owner", err))?;
        }
        rfs::chmodat(dir, name, Mode::from_raw_mode(e.mode), AtFlags::empty())
            .map_err(|err| entry_err(entry, "set the mode", err))?;
        set_times_at(dir, name, e.mtime, entry)
    }

    fn make_symlink(
        &mut self,
        parent: &[&[u8]],
        name: &[u8],
        e: &Entry,
        entry: &str,
    ) -> Result<()> {
        if e.link.is_empty() {
            return Err(Error::Rejected {
                entry: entry.to_string(),
                reason: "symlink with an empty target".into(),
            });
        }
        let dir = self.dir_create(parent, entry)?;
        self.clear(&dir, name, false, entry)?;
        rfs::symlinkat(&e.link[..], &*dir, name)
            .map_err(|err| entry_err(entry, "create the symlink", err))?;
        if self.opts.owners == Owners::Keep {
            let (uid, gid) = ids(e.uid, e.gid, entry)?;
            rfs::chownat(&*dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|err| entry_err(entry, "change the owner", err))?;
        }
        set_times_at(&dir, name, e.mtime, entry)
    }

    fn make_hard_link(
        &mut self,
        parent: &[&[u8]],
        name: &[u8],
        key: &[u8],
        e: &Entry,
        entry: &str,
    ) -> Result<()> {
        let target_name = lossy(&e.link);
        let target = normalize(&e.link).map_err(|reason| Error::Rejected {
            entry: entry.to_string(),
            reason: format!("hard link target `{target_name}`: {reason}"),
        })?;
        let Some((&tname, tparent)) = target.split_last() else {
            return Err(Error::Rejected {
                entry: entry.to_string(),
                reason: "hard link to the target directory itself".into(),
            });
        };
        if join(&target) == key {
            return Err(Error::Rejected {
                entry: entry.to_string(),
                reason: "hard link to itself".into(),
            });
        }
        let missing = || Error::Rejected {
            entry: entry.to_string(),
            reason: format!("hard link target `{target_name}` does not exist"),
        };
        let tdir = self.dir_existing(tparent, entry)?.ok_or_else(missing)?;
        let dir = self.dir_create(parent, entry)?;
        self.clear(&dir, name, false, entry)?;
        match rfs::linkat(&*tdir, tname, &*dir, name, AtFlags::empty()) {
            Ok(()) => Ok(()),
            Err(Errno::NOENT) => Err(missing()),
            Err(Errno::PERM) if is_dir_at(&tdir, tname) => Err(Error::Rejected {
                entry: entry.to_string(),
                reason: format!("hard link target `{target_name}` is a directory"),
            }),
            Err(err) => Err(entry_err(entry, "create the hard link", err)),
        }
    }

    fn make_node(
        &mut self,
        parent: &[&[u8]],
        name: &[u8],
        e: &Entry,
        ty: FileType,
        dev: rfs::Dev,
        entry: &str,
    ) -> Result<()> {
        let dir = self.dir_create(parent, entry)?;
        self.clear(&dir, name, false, entry)?;
        rfs::mknodat(&*dir, name, ty, Mode::RUSR | Mode::WUSR, dev)
            .map_err(|err| entry_err(entry, "create the node", err))?;
        self.set_meta_at(&dir, name, e, entry)
    }

    fn make_device<R: Read>(
        &mut self,
        parent: &[&[u8]],
        name: &[u8],
        key: &[u8],
        e: &Entry,
        body: &mut R,
        entry: &str,
    ) -> Result<()> {
        let kind = if e.kind == Kind::Char {
            DeviceKind::Char
        } else {
            DeviceKind::Block
        };
        match self.opts.devices {
            Devices::Create => {
                let ty = match kind {
                    DeviceKind::Char => FileType::CharacterDevice,
                    DeviceKind::Block => FileType::BlockDevice,
                };
                self.make_node(parent, name, e, ty, rfs::makedev(e.major, e.minor), entry)?;
            }
            Devices::Placeholder => {
                // Same as an empty regular file (`e.size` is 0 for devices).
                self.make_file(parent, name, e, body, entry)?;
            }
        }
        let mut path = b"/".to_vec();
        path.extend_from_slice(key);
        self.devices.push(DeviceNode {
            path: lossy(&path),
            kind,
            major: e.major,
            minor: e.minor,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
        });
        Ok(())
    }

    fn whiteout(&mut self, parent: &[&[u8]], name: &[u8], entry: &str) -> Result<()> {
        let Some(dir) = self.dir_existing(parent, entry)? else {
            return Ok(());
        };
        let key = child_key(&join(parent), name);
        self.prune(&dir, &key, name, entry)
    }

    fn opaque(&mut self, dir_comps: &[&[u8]], entry: &str) -> Result<()> {
        let dir = self.dir_create(dir_comps, entry)?;
        let key = join(dir_comps);
        let names =
            list_names(&*dir).map_err(|e| entry_err_io(entry, "list the opaque directory", e))?;
        for child in names {
            let ck = child_key(&key, &child);
            self.prune(&dir, &ck, &child, entry)?;
        }
        Ok(())
    }

    fn created_below(&self, key: &[u8]) -> bool {
        let mut prefix = key.to_vec();
        prefix.push(b'/');
        self.created
            .range(prefix.clone()..)
            .next()
            .is_some_and(|k| k.starts_with(&prefix))
    }

    /// Removes what lower layers left at `key` (`name` in `dir`), keeping
    /// whatever this layer wrote there or below.
    fn prune(&mut self, dir: &Dir, key: &[u8], name: &[u8], entry: &str) -> Result<()> {
        let st = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(entry_err(entry, "inspect a whited-out entry", e)),
        };
        if is_dir(&st) {
            if self.created.contains(key) || self.created_below(key) {
                let fd = beneath::open_dir_path(dir, name)
                    .map_err(|e| entry_err(entry, "open a whited-out directory", e))?;
                let sub = dir_from_fd(fd);
                self.loosen(&sub, key, entry)?;
                let names = list_names(&sub)
                    .map_err(|e| entry_err_io(entry, "list a whited-out directory", e))?;
                for child in names {
                    let ck = child_key(key, &child);
                    self.prune(&sub, &ck, &child, entry)?;
                }
                return Ok(());
            }
            self.cache = None;
            remove_tree(dir, name)
                .map_err(|e| entry_err_io(entry, "remove a whited-out directory", e))
        } else if self.created.contains(key) {
            Ok(())
        } else {
            rfs::unlinkat(dir, name, AtFlags::empty())
                .map_err(|e| entry_err(entry, "remove a whited-out entry", e))
        }
    }
}

impl DirMeta {
    fn new(key: Vec<u8>, depth: usize, e: &Entry) -> Self {
        DirMeta {
            key,
            depth,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            mtime: e.mtime,
            xattrs: e.xattrs.clone(),
        }
    }
}

fn is_dir_at(dir: &Dir, name: &[u8]) -> bool {
    rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| is_dir(&st))
}

fn ids(uid: u64, gid: u64, entry: &str) -> Result<(Uid, Gid)> {
    let bad = |what: &str, v: u64| Error::Rejected {
        entry: entry.to_string(),
        reason: format!("{what} {v} out of range"),
    };
    let u = u32::try_from(uid).map_err(|_| bad("uid", uid))?;
    let g = u32::try_from(gid).map_err(|_| bad("gid", gid))?;
    Ok((Uid::from_raw(u), Gid::from_raw(g)))
}

fn set_times_fd<Fd: AsFd>(fd: Fd, mtime: i64, entry: &str) -> Result<()> {
    rfs::futimens(fd, &crate::relink::times(mtime))
        .map_err(|e| entry_err(entry, "set the modification time", e))
}

fn set_times_at(dir: &Dir, name: &[u8], mtime: i64, entry: &str) -> Result<()> {
    rfs::utimensat(
        dir,
        name,
        &crate::relink::times(mtime),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| entry_err(entry, "set the modification time", e))
}

fn entry_err(entry: &str, op: &'static str, e: Errno) -> Error {
    Error::Entry {
        entry: entry.to_string(),
        op,
        source: e.into(),
    }
}

fn entry_err_io(entry: &str, op: &'static str, source: io::Error) -> Error {
    Error::Entry {
        entry: entry.to_string(),
        op,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_names() {
        let n = |s: &str| normalize(s.as_bytes()).map(|v| join(&v));
        assert_eq!(n("./a/b/"), Ok(b"a/b".to_vec()));
        assert_eq!(n("a//./b"), Ok(b"a/b".to_vec()));
        assert_eq!(n("a/../b"), Ok(b"b".to_vec()));
        assert_eq!(n("./"), Ok(Vec::new()));
        assert!(n("../x").is_err());
        assert!(n("a/../../x").is_err());
        assert!(n("/etc/passwd").is_err());
        assert!(n("/./x").is_err());
        assert_eq!(n("/"), Ok(Vec::new()));
        assert!(n("").is_err());
        assert!(normalize(b"a\0b").is_err());
    }
}
