//! The unpacked tree of a remixed image ([`crate::squash::remix`]) made
//! from its base's tree instead of from the new SIF: every entry of the
//! base's tree that is not a directory becomes a hard link to the base's
//! (setuid and setgid files are copied: see [`crate::dedup`]), directories
//! are made anew with the base's modes, owners and times, and then the
//! remix's edits are written with the remix's rules, so that the tree is
//! the one unpacking the new SIF would give: the same entries, modes,
//! contents and times, the owners the base's tree has (what the store gave
//! the caller) and, for what the edits make, theirs.
//!
//! Safe for the reasons sharing is ([`crate::dedup`]): the store's trees
//! are never written in place. A file an edit writes is made anew (the
//! link to the base is removed first), never written through. Everything
//! is reached through directory fds with `O_NOFOLLOW`; a base entry newer
//! than the remix's time (the SIF has the time clamped, the tree would
//! not), an entry whose mode or owner do not come out as asked, or
//! anything else unexpected is an error, and the caller makes the tree the
//! ordinary way.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use sifbox_sys::beneath::open_dir;

use crate::squash::{Edit, FileSource, RemixOptions};

/// Who owns what the edits make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeOwners {
    /// The owners the edits give (root: as the SIF records them).
    Recorded,
    /// The caller's (uid, gid) for what the SIF records as root's; an
    /// edit of any other owner is an error.
    CallerForRoot { uid: u32, gid: u32 },
}

/// What [`make_tree`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Relinked {
    /// Entries of the base linked.
    pub linked: u64,
    /// Setuid and setgid files of the base copied.
    pub copied: u64,
    /// Edits written.
    pub edits: u64,
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::other(what.into())
}

/// Access and modification times both `t` (seconds), as unpacking sets
/// them.
pub(crate) fn times(t: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: t,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Makes at `dest` (which must not exist; its parent must) the tree of
/// the image that `edits` with `opts` make from the image whose tree is
/// `base`, as described in the module docs. `newest`: the base image's
/// own time, which no entry of its tree may be newer than (a tree that
/// is not its SIF's twin is refused); at most `opts.time`. No edit may
/// rewrite a file of several names ([`crate::squash::RemixStats::
/// rewritten_links`] 0): the remix writes every name of it, this only the
/// one the edit names (the others may be another tree's).
pub fn make_tree(
    base: &Path,
    dest: &Path,
    edits: &[Edit],
    opts: &RemixOptions,
    owners: TreeOwners,
    newest: u32,
) -> io::Result<Relinked> {
    if newest > opts.time {
        return Err(bad("the base's time is newer than the new image's"));
    }
    let src = open_dir(rustix::fs::CWD, base)?;
    let st = rustix::fs::fstat(&src)?;
    rustix::fs::mkdir(dest, Mode::from_raw_mode(0o700))?;
    let top = open_dir(rustix::fs::CWD, dest)?;
    let mut out = Relinked::default();
    if st.st_mtime > i64::from(newest) {
        return Err(bad("the root: newer than the image's time"));
    }
    link_dir(&src, &top, newest, &mut out, &mut Copies::new(), 0)?;
    copy_meta(&top, &st)?;
    let mut w = Writer {
        top: &top,
        opts,
        owners,
        dir_times: BTreeMap::new(),
    };
    for e in edits {
        w.apply(e)?;
        out.edits += 1;
    }
    for (path, t) in &w.dir_times {
        let fd = w.walk(path)?;
        rustix::fs::futimens(&fd, &times(*t))?;
    }
    Ok(out)
}

/// Gives the directory `fd` the mode, owner and times of `st` (when they
/// are not already its own).
fn copy_meta(fd: &OwnedFd, st: &rustix::fs::Stat) -> io::Result<()> {
    let now = rustix::fs::fstat(fd)?;
    if (now.st_uid, now.st_gid) != (st.st_uid, st.st_gid) {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(st.st_uid)),
            Some(rustix::fs::Gid::from_raw(st.st_gid)),
        )?;
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    rustix::fs::futimens(fd, &times(st.st_mtime))?;
    let got = rustix::fs::fstat(fd)?;
    if (got.st_mode & 0o7777, got.st_uid, got.st_gid) != (st.st_mode & 0o7777, st.st_uid, st.st_gid)
    {
        return Err(bad("a directory did not take its mode or owner"));
    }
    Ok(())
}

/// The copies made of the base's setuid and setgid files, by (device,
/// inode) in the base: the dir and name of the first, which its other
/// names link to.
type Copies = std::collections::HashMap<(u64, u64), (OwnedFd, CString)>;

/// Links (or copies) the entries of `src` into `dst`, directories made
/// anew and given their times once their entries are in.
fn link_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    newest: u32,
    out: &mut Relinked,
    copies: &mut Copies,
    depth: usize,
) -> io::Result<()> {
    if depth > 4096 {
        return Err(bad("the base's tree is too deep"));
    }
    let mut names: Vec<CString> = Vec::new();
    for e in rustix::fs::Dir::read_from(src)? {
        let e = e?;
        let n = e.file_name();
        if n != c"." && n != c".." {
            names.push(n.to_owned());
        }
    }
    for name in names {
        let st = rustix::fs::statat(src, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if st.st_mtime > i64::from(newest) {
            return Err(bad(format!(
                "{}: newer than the image's time",
                name.to_string_lossy()
            )));
        }
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let s = open_dir(src, name.as_c_str())?;
                rustix::fs::mkdirat(dst, name.as_c_str(), Mode::from_raw_mode(0o700))?;
                let d = open_dir(dst, name.as_c_str())?;
                link_dir(&s, &d, newest, out, copies, depth + 1)?;
                copy_meta(&d, &st)?;
            }
            FileType::RegularFile if st.st_mode & 0o6000 != 0 => {
                // Another name of a copy made before: that copy.
                match copies.get(&(st.st_dev, st.st_ino)) {
                    Some((dir, first)) => rustix::fs::linkat(
                        dir,
                        first.as_c_str(),
                        dst,
                        name.as_c_str(),
                        AtFlags::empty(),
                    )?,
                    None => {
                        copy_file(src, dst, &name, &st)?;
                        copies.insert((st.st_dev, st.st_ino), (dst.try_clone()?, name.clone()));
                        out.copied += 1;
                    }
                }
            }
            _ => {
                rustix::fs::linkat(src, name.as_c_str(), dst, name.as_c_str(), AtFlags::empty())?;
                out.linked += 1;
            }
        }
    }
    Ok(())
}

/// Copies the regular file `src/name` to `dst/name` with its mode, owner
/// and times.
fn copy_file(src: &OwnedFd, dst: &OwnedFd, name: &CStr, st: &rustix::fs::Stat) -> io::Result<()> {
    let mut from = File::from(rustix::fs::openat(
        src,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?);
    let to = rustix::fs::openat(
        dst,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut to_file = File::from(to);
    io::copy(&mut from, &mut to_file)?;
    set_file_meta(&to_file, st.st_mode, (st.st_uid, st.st_gid), st.st_mtime)
}

/// Gives a file the caller made its owner, then its mode (a chown clears
/// setuid bits), then its times, and checks that they took.
fn set_file_meta(f: &File, mode: u32, (uid, gid): (u32, u32), mtime: i64) -> io::Result<()> {
    rustix::fs::fchown(
        f,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )?;
    rustix::fs::fchmod(f, Mode::from_raw_mode(mode & 0o7777))?;
    rustix::fs::futimens(f, &times(mtime))?;
    let got = rustix::fs::fstat(f)?;
    if (got.st_mode & 0o7777, got.st_uid, got.st_gid) != (mode & 0o7777, uid, gid) {
        return Err(bad("a file did not take its mode or owner"));
    }
    Ok(())
}

/// Writes edits into the tree.
struct Writer<'a> {
    top: &'a OwnedFd,
    opts: &'a RemixOptions,
    owners: TreeOwners,
    /// The times the directories the edits changed end with.
    dir_times: BTreeMap<Vec<Vec<u8>>, i64>,
}

impl Writer<'_> {
    /// The tree's owner for what the SIF records as `(uid, gid)`.
    fn owner(&self, (uid, gid): (u32, u32)) -> io::Result<(u32, u32)> {
        match self.owners {
            TreeOwners::Recorded => Ok((uid, gid)),
            TreeOwners::CallerForRoot { uid: u, gid: g } if (uid, gid) == (0, 0) => Ok((u, g)),
            TreeOwners::CallerForRoot { .. } => Err(bad(format!(
                "an entry of {uid}:{gid}, which the caller's tree cannot show"
            ))),
        }
    }

    /// The directory at `path` (components below the top), not following
    /// anything.
    fn walk(&self, path: &[Vec<u8>]) -> io::Result<OwnedFd> {
        let mut fd = open_dir(self.top, c".")?;
        for c in path {
            fd = open_dir(&fd, CString::new(c.clone()).map_err(bad_name)?.as_c_str())?;
        }
        Ok(fd)
    }

    /// `dir` is about to get or lose an entry: unless an edit gave it a
    /// time, it keeps the one it has.
    fn keep_time(&mut self, path: &[Vec<u8>], dir: &OwnedFd) -> io::Result<()> {
        if !self.dir_times.contains_key(path) {
            let st = rustix::fs::fstat(dir)?;
            self.dir_times.insert(path.to_vec(), st.st_mtime);
        }
        Ok(())
    }

    fn set_time(&mut self, path: &[Vec<u8>], t: u32) {
        self.dir_times
            .insert(path.to_vec(), i64::from(t.min(self.opts.time)));
    }

    /// Makes the directory `name` in `dir` (at `path`) with this mode,
    /// owner (as the SIF records it) and time.
    fn mkdir(
        &mut self,
        dir: &OwnedFd,
        path: &[Vec<u8>],
        name: &CStr,
        mode: u16,
        owner: (u32, u32),
        mtime: u32,
    ) -> io::Result<()> {
        let (uid, gid) = self.owner(owner)?;
        rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?;
        let fd = open_dir(dir, name)?;
        let mut st = rustix::fs::fstat(&fd)?;
        st.st_mode = u32::from(mode);
        st.st_uid = uid;
        st.st_gid = gid;
        st.st_mtime = i64::from(mtime);
        copy_meta(&fd, &st)?;
        let mut p = path.to_vec();
        p.push(name.to_bytes().to_vec());
        self.set_time(&p, mtime);
        Ok(())
    }

    /// Makes the regular file `name` in `dir` holding `data`.
    fn create(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        data: &FileSource,
        mode: u16,
        owner: (u32, u32),
        mtime: u32,
    ) -> io::Result<()> {
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut f = File::from(fd);
        match data {
            FileSource::Bytes(b) => f.write_all(b)?,
            FileSource::Open(o) => {
                let mut r = io::Read::take(
                    ReadAt {
                        f: o.as_file(),
                        at: 0,
                    },
                    o.size(),
                );
                let n = io::copy(&mut r, &mut f)?;
                let mut one = [0u8; 1];
                if n != o.size()
                    || (ReadAt {
                        f: o.as_file(),
                        at: n,
                    })
                    .read(&mut one)?
                        != 0
                {
                    return Err(bad("a file changed size while being written"));
                }
            }
        }
        set_file_meta(
            &f,
            u32::from(mode),
            owner,
            i64::from(mtime.min(self.opts.time)),
        )
    }

    fn apply(&mut self, edit: &Edit) -> io::Result<()> {
        let names: Vec<Vec<u8>> = edit
            .path()
            .split('/')
            .filter(|c| !c.is_empty())
            .map(|c| c.as_bytes().to_vec())
            .collect();
        if let Edit::DirAs { attrs, .. } = edit {
            let owner = self.owner((attrs.uid, attrs.gid))?;
            let same = |st: &rustix::fs::Stat| {
                (st.st_mode & 0o7777, st.st_uid, st.st_gid)
                    == (u32::from(attrs.mode & 0o7777), owner.0, owner.1)
            };
            let Some((last, parents)) = names.split_last() else {
                if !same(&rustix::fs::fstat(self.top)?) {
                    return Err(bad("the root's mode or owner differ from the edit's"));
                }
                self.set_time(&[], attrs.mtime);
                return Ok(());
            };
            let dir = self.walk(parents)?;
            let name = CString::new(last.clone()).map_err(bad_name)?;
            match rustix::fs::statat(&dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    if !same(&st) {
                        return Err(bad(format!(
                            "/{}: mode or owner differ from the edit's",
                            edit.path()
                        )));
                    }
                    self.set_time(&names, attrs.mtime);
                }
                Ok(_) => return Err(bad("a directory edit over a file")),
                Err(rustix::io::Errno::NOENT) => {
                    self.keep_time(parents, &dir)?;
                    self.mkdir(
                        &dir,
                        parents,
                        name.as_c_str(),
                        attrs.mode,
                        (attrs.uid, attrs.gid),
                        attrs.mtime,
                    )?;
                }
                Err(e) => return Err(e.into()),
            }
            return Ok(());
        }
        if let Edit::NewFile { data, attrs, .. } = edit {
            let (last, parents) = names.split_last().ok_or_else(|| bad("no name"))?;
            let dir = self.walk(parents)?;
            let name = CString::new(last.clone()).map_err(bad_name)?;
            self.keep_time(parents, &dir)?;
            let owner = self.owner((attrs.uid, attrs.gid))?;
            return self.create(&dir, name.as_c_str(), data, attrs.mode, owner, attrs.mtime);
        }
        // The layout's edits: missing parents made, the edits' time and
        // owner, the dirs they add to given that time.
        let time = self.opts.time;
        let root_owner = self.opts.owner;
        let (last, parents) = names.split_last().ok_or_else(|| bad("no name"))?;
        let mut dir = open_dir(self.top, c".")?;
        for (i, c) in parents.iter().enumerate() {
            let name = CString::new(c.clone()).map_err(bad_name)?;
            match open_dir(&dir, name.as_c_str()) {
                Ok(fd) => dir = fd,
                Err(rustix::io::Errno::NOENT) => {
                    self.mkdir(&dir, &names[..i], name.as_c_str(), 0o755, root_owner, time)?;
                    self.set_time(&names[..i], time);
                    dir = open_dir(&dir, name.as_c_str())?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let name = CString::new(last.clone()).map_err(bad_name)?;
        let there = match rustix::fs::statat(&dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(e.into()),
        };
        match (edit, there) {
            (Edit::Dir { .. }, Some(st)) => {
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    return Err(bad("a directory edit over a file"));
                }
            }
            (Edit::Dir { .. }, None) => {
                self.mkdir(&dir, parents, name.as_c_str(), 0o755, root_owner, time)?;
                self.set_time(parents, time);
            }
            (Edit::FileIfMissing { .. }, Some(_)) => {}
            (Edit::FileIfMissing { .. }, None) => {
                let owner = self.owner(root_owner)?;
                self.create(
                    &dir,
                    name.as_c_str(),
                    &FileSource::Bytes(Vec::new()),
                    0o644,
                    owner,
                    time,
                )?;
                self.set_time(parents, time);
            }
            (Edit::File { data, mode, .. }, there) => {
                let data = FileSource::Bytes(data.clone());
                match there {
                    Some(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                        // Made anew in its place (never written through: it
                        // may be the base's), with its owner; the dir keeps
                        // its time, as writing through a file leaves it.
                        self.keep_time(parents, &dir)?;
                        rustix::fs::unlinkat(&dir, name.as_c_str(), AtFlags::empty())?;
                        self.create(
                            &dir,
                            name.as_c_str(),
                            &data,
                            *mode,
                            (st.st_uid, st.st_gid),
                            time,
                        )?;
                    }
                    Some(_) => return Err(bad("a file edit over a non-file")),
                    None => {
                        let owner = self.owner(root_owner)?;
                        self.create(&dir, name.as_c_str(), &data, *mode, owner, time)?;
                        self.set_time(parents, time);
                    }
                }
            }
            (Edit::DirAs { .. } | Edit::NewFile { .. }, _) => unreachable!("handled above"),
        }
        Ok(())
    }
}

fn bad_name(_: std::ffi::NulError) -> io::Error {
    bad("a name with a NUL byte")
}

/// Reads a file by offset from `at` on.
struct ReadAt<'a> {
    f: &'a File,
    at: u64,
}

impl io::Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.f, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}
