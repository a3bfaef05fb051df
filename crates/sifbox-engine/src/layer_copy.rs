//! Copying a sandbox's writable layer (its overlay upper dir) out of the
//! bounded file system it lives on into a directory that init holds open:
//! how a build step's layer is kept when the step wrote it on an ext4
//! image or a tmpfs of `--layer-size` (`Request::StopKeepingLayer`).
//!
//! init runs it after every other process of the sandbox is gone, so
//! nothing changes under it; still nothing is followed: each name is
//! opened `O_NOFOLLOW` below its directory's fd. Owners, modes, times,
//! extended attributes (overlay's `user.overlay.opaque`, file
//! capabilities), hard links and holes are kept; overlay's whiteouts (0/0
//! character devices) and fifos are made again; sockets are left out, as
//! is any other device (none can be made in a sandbox).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat, Timespec, Timestamps};

/// A directory being copied: both fds, its times (set once its entries
/// are in), its path below the top, the names left.
struct Level {
    src: OwnedFd,
    dst: OwnedFd,
    times: Timestamps,
    rel: PathBuf,
    rest: std::vec::IntoIter<OsString>,
}

fn times_of(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}

/// Copies the extended attributes of `src` onto `dst`.
fn copy_xattrs(src: &impl AsFd, dst: &impl AsFd) -> std::io::Result<()> {
    let mut list = vec![0u8; 4096];
    let n = loop {
        match rustix::fs::flistxattr(src, &mut list[..]) {
            Ok(n) => break n,
            Err(rustix::io::Errno::RANGE) if list.len() < 1 << 20 => list.resize(list.len() * 4, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    };
    let mut value = vec![0u8; 4096];
    for name in list[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = OsStr::from_bytes(name);
        let len = loop {
            match rustix::fs::fgetxattr(src, name, &mut value[..]) {
                Ok(len) => break len,
                Err(rustix::io::Errno::RANGE) if value.len() < 1 << 20 => {
                    value.resize(value.len() * 4, 0)
                }
                Err(e) => return Err(e.into()),
            }
        };
        rustix::fs::fsetxattr(dst, name, &value[..len], rustix::fs::XattrFlags::empty()).map_err(
            |e| {
                std::io::Error::new(
                    std::io::Error::from(e).kind(),
                    format!("extended attribute {}: {e}", name.to_string_lossy()),
                )
            },
        )?;
    }
    Ok(())
}

/// Copies the data of `src` (`size` bytes) into `dst`, holes kept.
fn copy_data(src: &File, dst: &File, size: u64) -> std::io::Result<()> {
    let extents = crate::transfer::sparse::extents(src, size)?.unwrap_or_else(|| vec![(0, size)]);
    let mut buf = Vec::new();
    for (off, len) in extents {
        let mut done = 0u64;
        // In the kernel where it can (the same kind of file system on both
        // sides), else through a buffer.
        while done < len {
            let (mut from, mut to) = (off + done, off + done);
            let want = usize::try_from(len - done)
                .unwrap_or(usize::MAX)
                .min(1 << 30);
            match rustix::fs::copy_file_range(src, Some(&mut from), dst, Some(&mut to), want) {
                Ok(0) => break,
                Ok(n) => done += n as u64,
                Err(_) => break,
            }
        }
        if done < len && buf.is_empty() {
            buf = vec![0u8; 256 << 10];
        }
        while done < len {
            let want = usize::try_from(len - done)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = src.read_at(&mut buf[..want], off + done)?;
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], off + done)?;
            done += n as u64;
        }
    }
    dst.set_len(size)
}

/// Copies the tree below `src` into the empty directory `dst` (see the
/// module's note).
pub fn copy_tree(src: OwnedFd, dst: OwnedFd) -> std::io::Result<()> {
    let top = rustix::fs::fstat(&src)?;
    let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let rest = sifbox_sys::beneath::names(&src)?.into_iter();
    copy_xattrs(&src, &dst)?;
    let mut stack = vec![Level {
        src,
        dst,
        times: times_of(&top),
        rel: PathBuf::new(),
        rest,
    }];
    let nofollow = OFlags::NOFOLLOW | OFlags::CLOEXEC;
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.rest.next() else {
            let done = stack.pop().expect("a level");
            rustix::fs::futimens(&done.dst, &done.times)?;
            continue;
        };
        let rel = level.rel.join(&name);
        let at =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", rel.display()));
        let (s, d) = (&level.src, &level.dst);
        let st =
            rustix::fs::statat(s, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| at(e.into()))?;
        let ft = FileType::from_raw_mode(st.st_mode);
        let perm = Mode::from_raw_mode(st.st_mode & 0o7777);
        let (uid, gid) = (
            Some(rustix::fs::Uid::from_raw(st.st_uid)),
            Some(rustix::fs::Gid::from_raw(st.st_gid)),
        );
        match ft {
            FileType::Directory => {
                let copy = || -> std::io::Result<Level> {
                    rustix::fs::mkdirat(d, &name, Mode::from_raw_mode(0o700))?;
                    let flags = OFlags::RDONLY | OFlags::DIRECTORY | nofollow;
                    let sfd = rustix::fs::openat(s, &name, flags, Mode::empty())?;
                    let dfd = rustix::fs::openat(d, &name, flags, Mode::empty())?;
                    copy_xattrs(&sfd, &dfd)?;
                    rustix::fs::fchown(&dfd, uid, gid)?;
                    rustix::fs::fchmod(&dfd, perm)?;
                    let rest = sifbox_sys::beneath::names(&sfd)?.into_iter();
                    Ok(Level {
                        src: sfd,
                        dst: dfd,
                        times: times_of(&st),
                        rel: rel.clone(),
                        rest,
                    })
                };
                let next = copy().map_err(at)?;
                stack.push(next);
            }
            FileType::RegularFile => {
                if st.st_nlink > 1 {
                    if let Some(first) = linked.get(&(st.st_dev, st.st_ino)) {
                        let top = &stack[0].dst;
                        rustix::fs::linkat(
                            top,
                            first,
                            &stack.last().expect("a level").dst,
                            &name,
                            AtFlags::empty(),
                        )
                        .map_err(|e| at(e.into()))?;
                        continue;
                    }
                    linked.insert((st.st_dev, st.st_ino), rel.clone());
                }
                let copy = || -> std::io::Result<()> {
                    let sf = File::from(rustix::fs::openat(
                        s,
                        &name,
                        OFlags::RDONLY | nofollow,
                        Mode::empty(),
                    )?);
                    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | nofollow;
                    let df = File::from(rustix::fs::openat(
                        d,
                        &name,
                        flags,
                        Mode::from_raw_mode(0o600),
                    )?);
                    copy_data(&sf, &df, u64::try_from(st.st_size).unwrap_or(0))?;
                    // Owner first (chown clears setuid bits), then the
                    // mode; capabilities last (a chown drops them too).
                    rustix::fs::fchown(&df, uid, gid)?;
                    rustix::fs::fchmod(&df, perm)?;
                    copy_xattrs(&sf, &df)?;
                    rustix::fs::futimens(&df, &times_of(&st))?;
                    Ok(())
                };
                copy().map_err(at)?;
            }
            FileType::Symlink => {
                let copy = || -> std::io::Result<()> {
                    let target = rustix::fs::readlinkat(s, &name, Vec::new())?;
                    rustix::fs::symlinkat(target.as_c_str(), d, &name)?;
                    rustix::fs::chownat(d, &name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
                    rustix::fs::utimensat(d, &name, &times_of(&st), AtFlags::SYMLINK_NOFOLLOW)?;
                    Ok(())
                };
                copy().map_err(at)?;
            }
            FileType::CharacterDevice | FileType::Fifo => {
                let whiteout = ft == FileType::CharacterDevice && st.st_rdev == 0;
                if ft == FileType::CharacterDevice && !whiteout {
                    tracing::warn!("{}: a device in a layer; left out", rel.display());
                    continue;
                }
                let copy = || -> std::io::Result<()> {
                    rustix::fs::mknodat(d, &name, ft, perm, st.st_rdev)?;
                    rustix::fs::chownat(d, &name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
                    Ok(())
                };
                copy().map_err(at)?;
            }
            _ => {
                tracing::debug!("{}: a socket or device in a layer; left out", rel.display());
            }
        }
    }
    Ok(())
}

/// Where [`copy_tree`] is used from: the tests only.
#[cfg(test)]
fn open_dir(p: &std::path::Path) -> OwnedFd {
    rustix::fs::open(
        p,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .expect("open")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    #[test]
    fn a_tree_is_copied_with_links_holes_modes_and_times() {
        let t = tempfile::tempdir().expect("tempdir");
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        std::fs::create_dir_all(src.join("d/e")).expect("mkdir");
        std::fs::create_dir(&dst).expect("mkdir");
        std::fs::write(src.join("d/f"), "data").expect("write");
        std::fs::hard_link(src.join("d/f"), src.join("h")).expect("link");
        std::os::unix::fs::symlink("/etc/passwd", src.join("l")).expect("symlink");
        let sp = File::create(src.join("sparse")).expect("create");
        sp.write_all_at(b"x", 8 << 20).expect("write");
        rustix::fs::mknodat(
            open_dir(&src),
            "fifo",
            FileType::Fifo,
            Mode::from_raw_mode(0o640),
            0,
        )
        .expect("mkfifo");
        std::fs::set_permissions(
            src.join("d/e"),
            std::os::unix::fs::PermissionsExt::from_mode(0o705),
        )
        .expect("chmod");
        let old = Timestamps {
            last_access: Timespec {
                tv_sec: 1_500_000_000,
                tv_nsec: 0,
            },
            last_modification: Timespec {
                tv_sec: 1_500_000_000,
                tv_nsec: 0,
            },
        };
        rustix::fs::utimensat(open_dir(&src), "d", &old, AtFlags::empty()).expect("utime");
        copy_tree(open_dir(&src), open_dir(&dst)).expect("copy");
        assert_eq!(std::fs::read(dst.join("h")).expect("read"), b"data");
        let (a, b) = (
            std::fs::metadata(dst.join("h")).expect("stat"),
            std::fs::metadata(dst.join("d/f")).expect("stat"),
        );
        assert_eq!(a.ino(), b.ino(), "one inode");
        assert_eq!(
            std::fs::read_link(dst.join("l")).expect("readlink"),
            Path::new("/etc/passwd")
        );
        let md = std::fs::metadata(dst.join("d/e")).expect("stat");
        assert_eq!(md.mode() & 0o7777, 0o705);
        assert_eq!(
            std::fs::metadata(dst.join("d")).expect("stat").mtime(),
            1_500_000_000
        );
        let sp = std::fs::metadata(dst.join("sparse")).expect("stat");
        assert_eq!(sp.len(), (8 << 20) + 1);
        assert!(sp.blocks() < 1024, "{} blocks", sp.blocks());
        let fifo = std::fs::symlink_metadata(dst.join("fifo")).expect("stat");
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
    }
}
