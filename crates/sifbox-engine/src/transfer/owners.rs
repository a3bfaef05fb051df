//! Whole trees at once: `/` as a tar (an image of a build step), and the
//! owners of a tree bound into sandboxes given back to the caller or
//! mirrored from `/`. Every step is relative to a directory fd.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Gid, Uid, CWD};
use sifbox_sys::beneath;

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

/// Gives `top` and every entry beneath it to root of the sandbox (that is,
/// to the caller outside): a tree on the host, bound in, that sandboxes
/// filled with files of other ids of the caller's mapping, which the caller
/// could neither read nor remove. Only those ids change: a group that is
/// not mapped here (the host group of a setgid project dir, which shows as
/// the overflow gid) stays. Every step is relative to a directory fd
/// ([`sifbox_sys::walk`], any depth): no symlink is followed (a link
/// itself is given back), nothing on another file system is entered. What
/// cannot be given back is skipped; the first such error is returned once
/// the rest is done.
pub fn give_back(top: &Path) -> std::io::Result<()> {
    use sifbox_sys::walk::{self, Entry, Step};
    struct GiveBack {
        overflow: u32,
        first: Option<std::io::Error>,
    }
    impl GiveBack {
        /// The owner to set: root for an id of the mapping that is not
        /// root's, unchanged (None) otherwise.
        fn change(&self, st: &rustix::fs::Stat) -> Option<(Option<Uid>, Option<Gid>)> {
            let uid = (st.st_uid != 0).then(|| Uid::from_raw(0));
            let gid = (st.st_gid != 0 && st.st_gid != self.overflow).then(|| Gid::from_raw(0));
            (uid.is_some() || gid.is_some()).then_some((uid, gid))
        }
    }
    impl walk::Visitor for GiveBack {
        fn entry(&mut self, e: &Entry<'_>) -> std::io::Result<Step> {
            if let Some((u, g)) = self.change(e.stat) {
                if let Err(err) =
                    rustix::fs::chownat(e.dir, e.name, u, g, AtFlags::SYMLINK_NOFOLLOW)
                {
                    self.error(e.path, err.into())?;
                }
            }
            Ok(Step::Descend)
        }
        fn error(&mut self, path: &Path, err: std::io::Error) -> std::io::Result<()> {
            self.first.get_or_insert(std::io::Error::new(
                err.kind(),
                format!("{}: {err}", path.display()),
            ));
            Ok(())
        }
    }
    let mut v = GiveBack {
        overflow: std::fs::read_to_string("/proc/sys/fs/overflowgid")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(65534u32),
        first: None,
    };
    let top_fd = beneath::open_dir(CWD, top)?;
    let top_st = rustix::fs::fstat(&top_fd)?;
    if let Some((u, g)) = v.change(&top_st) {
        if let Err(e) = rustix::fs::fchown(&top_fd, u, g) {
            v.first = Some(e.into());
        }
    }
    walk::walk(
        top_fd.as_fd(),
        walk::Options {
            one_file_system: true,
        },
        &mut v,
    )?;
    v.first.map_or(Ok(()), Err)
}

/// Whether `top` or anything beneath it (not followed, on `top`'s file
/// system, at any depth) belongs to another uid than `uid` or to a group
/// not in `gids` (the caller's: a setgid project dir's group is fine), or
/// cannot be looked at: what [`give_back`] is for. A `top` that does not
/// exist has nothing. Reads only metadata, by dir fds; stops at the first
/// such entry.
pub fn anything_not_owned_by(top: &Path, uid: u32, gids: &[u32]) -> bool {
    use sifbox_sys::walk::{self, Entry, Step};
    struct Foreign<'g> {
        uid: u32,
        gids: &'g [u32],
        found: bool,
    }
    impl walk::Visitor for Foreign<'_> {
        fn entry(&mut self, e: &Entry<'_>) -> std::io::Result<Step> {
            if e.stat.st_uid != self.uid || !self.gids.contains(&e.stat.st_gid) {
                self.found = true;
                return Ok(Step::Stop);
            }
            Ok(Step::Descend)
        }
        fn error(&mut self, _path: &Path, err: std::io::Error) -> std::io::Result<()> {
            self.found = true;
            Err(err)
        }
    }
    let top_fd = match beneath::open_dir(CWD, top) {
        Ok(fd) => fd,
        // Nothing there, nothing to give back.
        Err(rustix::io::Errno::NOENT) => return false,
        Err(_) => return true,
    };
    match rustix::fs::fstat(&top_fd) {
        Ok(st) if st.st_uid == uid && gids.contains(&st.st_gid) => {}
        _ => return true,
    }
    let mut v = Foreign {
        uid,
        gids,
        found: false,
    };
    let walked = walk::walk(
        top_fd.as_fd(),
        walk::Options {
            one_file_system: true,
        },
        &mut v,
    );
    v.found || walked.is_err()
}

/// Gives every entry of the tree `dst` (a copy of `/` made by the caller,
/// owned by it, bound into the sandbox) the owner its original in `/` has
/// here, where it is not root's: the copy then belongs to the ids of the
/// sandbox's mapping, as the original does. Other mounts and `dst` itself
/// are left out; each directory of `dst` is reached from `dst`'s fd without
/// following any symlink ([`beneath::reach_dir`]), so no symlink in it
/// leads anywhere. Entries missing from `dst`, or not directories there,
/// are skipped.
pub fn mirror_owners(dst: &Path) -> std::io::Result<()> {
    let mounts = mount_points()?;
    let out = beneath::open_dir(CWD, dst)?;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = Path::new("/").join(&rel);
        let out_dir = if rel.as_os_str().is_empty() {
            out.try_clone()?
        } else {
            match beneath::reach_dir(&out, &rel, None) {
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
