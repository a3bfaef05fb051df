//! Sharing files between unpacked trees of a store: a built image's tree
//! is mostly the tree of the image it was built `FROM` (and of its step
//! layers), byte for byte; those files become hard links to the ones
//! already stored, so each image's tree costs only what it changed.
//!
//! Safe because the store's trees are never written in place: sandboxes
//! see them as read-only overlay layers (writes are copied up), and what
//! the store itself changes in a tree is the setuid strip of a shared store,
//! which touches no linked file: setuid and setgid files are never linked.
//! A file is linked only when everything a link shares is equal: type (regular file), size, mode, owner, group,
//! modification time and contents. Everything is reached through directory
//! fds with `O_NOFOLLOW`, never by path: the trees hold what a build wrote.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sifbox_sys::beneath::open_dir;

/// What [`link_identical`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Linked {
    /// Files replaced by hard links.
    pub files: u64,
    /// Their bytes, no longer stored twice.
    pub bytes: u64,
}

/// Replaces each regular file of `tree` by a hard link to the file at the
/// same path in the first of `sources` that has anything at that path,
/// when the two are identical (see the module docs). `sources` come top
/// first (a state's layers, then its base), as an overlay would look them
/// up; all must be on `tree`'s file system (the store's).
pub fn link_identical(tree: &Path, sources: &[&Path]) -> io::Result<Linked> {
    let top = open_dir(rustix::fs::CWD, tree)?;
    let mut srcs = Vec::new();
    for s in sources {
        match open_dir(rustix::fs::CWD, *s) {
            Ok(fd) => srcs.push(Some(fd)),
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut out = Linked::default();
    walk(&top, &mut srcs, &mut out)?;
    Ok(out)
}

/// One dir of the tree, with the same dir in each source (`None` where a
/// source has no dir there: nothing below can come from it).
fn walk(dir: &OwnedFd, srcs: &mut [Option<OwnedFd>], out: &mut Linked) -> io::Result<()> {
    // Linking over a name changes the dir's times: they are put back, so
    // that the tree keeps the times its SIF records.
    let before = rustix::fs::fstat(dir)?;
    let linked_before = out.files;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(dir)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push((e.file_name().to_owned(), e.file_type()));
        }
    }
    for (name, kind) in names {
        let kind = match kind {
            FileType::Unknown => {
                match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(_) => continue,
                }
            }
            k => k,
        };
        match kind {
            FileType::Directory => {
                let sub = match rustix::fs::openat(
                    dir,
                    name.as_c_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(_) => continue,
                };
                let mut below: Vec<Option<OwnedFd>> = Vec::with_capacity(srcs.len());
                let mut hidden = false;
                for s in srcs.iter() {
                    // A source above that has something other than a dir
                    // here hides the ones below it.
                    let fd = match (s, hidden) {
                        (Some(s), false) => {
                            match rustix::fs::statat(s, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                            {
                                Ok(st)
                                    if FileType::from_raw_mode(st.st_mode)
                                        == FileType::Directory =>
                                {
                                    rustix::fs::openat(
                                        s,
                                        name.as_c_str(),
                                        OFlags::RDONLY
                                            | OFlags::DIRECTORY
                                            | OFlags::NOFOLLOW
                                            | OFlags::CLOEXEC,
                                        Mode::empty(),
                                    )
                                    .ok()
                                }
                                Ok(_) => {
                                    hidden = true;
                                    None
                                }
                                Err(_) => None,
                            }
                        }
                        _ => None,
                    };
                    below.push(fd);
                }
                walk(&sub, &mut below, out)?;
            }
            FileType::RegularFile => {
                // The first source with anything here decides.
                for s in srcs.iter().flatten() {
                    match rustix::fs::statat(s, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(_) => {
                            if let Some(n) = link_if_same(dir, s, &name)? {
                                out.files += 1;
                                out.bytes += n;
                            }
                            break;
                        }
                        Err(_) => continue,
                    }
                }
            }
            _ => {}
        }
    }
    if out.files != linked_before {
        let times = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: before.st_atime,
                tv_nsec: i64::try_from(before.st_atime_nsec).unwrap_or(0),
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: before.st_mtime,
                tv_nsec: i64::try_from(before.st_mtime_nsec).unwrap_or(0),
            },
        };
        rustix::fs::futimens(dir, &times)?;
    }
    Ok(())
}

/// Links `src/name` over `dir/name` when they are identical; returns the
/// size linked.
fn link_if_same(dir: &OwnedFd, src: &OwnedFd, name: &std::ffi::CStr) -> io::Result<Option<u64>> {
    let a = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let b = match rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(b) => b,
        Err(_) => return Ok(None),
    };
    let same_meta = FileType::from_raw_mode(a.st_mode) == FileType::RegularFile
        && FileType::from_raw_mode(b.st_mode) == FileType::RegularFile
        && (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino)
        && a.st_dev == b.st_dev
        && a.st_size == b.st_size
        && a.st_mode == b.st_mode
        // Never a setuid or setgid file: the store strips those in some
        // trees and not in others (builds keep theirs).
        && a.st_mode & 0o6000 == 0
        && a.st_uid == b.st_uid
        && a.st_gid == b.st_gid
        && a.st_mtime == b.st_mtime
        && a.st_mtime_nsec == b.st_mtime_nsec;
    if !same_meta {
        return Ok(None);
    }
    let open = |at: &OwnedFd| -> io::Result<File> {
        Ok(File::from(rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )?))
    };
    if !same_contents(&mut open(dir)?, &mut open(src)?)? {
        return Ok(None);
    }
    // Linked under a temporary name, then renamed over: the tree never
    // lacks the file.
    let tmp = {
        let mut t = b".sifbox-link-".to_vec();
        t.extend_from_slice(name.to_bytes());
        std::ffi::CString::new(t).map_err(io::Error::other)?
    };
    rustix::fs::linkat(src, name, dir, tmp.as_c_str(), AtFlags::empty())?;
    if let Err(e) = rustix::fs::renameat(dir, tmp.as_c_str(), dir, name) {
        let _ = rustix::fs::unlinkat(dir, tmp.as_c_str(), AtFlags::empty());
        return Err(e.into());
    }
    Ok(Some(u64::try_from(a.st_size).unwrap_or(0)))
}

fn same_contents(a: &mut File, b: &mut File) -> io::Result<bool> {
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(a, &mut x)?;
        let m = read_full(b, &mut y)?;
        if n != m || x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn write(p: &Path, data: &[u8]) {
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, data).expect("write");
    }

    fn same_mtime(from: &Path, to: &Path) {
        let m = std::fs::metadata(from).expect("stat");
        let f = File::options().write(true).open(to).expect("open");
        f.set_modified(m.modified().expect("mtime")).expect("touch");
    }

    #[test]
    fn identical_files_are_linked_others_kept() {
        let t = tempfile::tempdir().expect("tempdir");
        let (base, layer, tree) = (
            t.path().join("base"),
            t.path().join("layer"),
            t.path().join("tree"),
        );
        for (p, d) in [
            ("etc/same", b"same".as_slice()),
            ("etc/changed", b"old"),
            ("bin/x", b"x"),
            ("hidden/f", b"h"),
        ] {
            write(&base.join(p), d);
        }
        write(&layer.join("bin/x"), b"y");
        // The layer replaces the dir `hidden` with a file.
        write(&layer.join("hidden"), b"not a dir");
        for (p, d) in [
            ("etc/same", b"same".as_slice()),
            ("etc/changed", b"new"),
            ("bin/x", b"y"),
            ("hidden/f", b"h"),
            ("new", b"n"),
        ] {
            write(&tree.join(p), d);
        }
        same_mtime(&base.join("etc/same"), &tree.join("etc/same"));
        same_mtime(&base.join("etc/changed"), &tree.join("etc/changed"));
        same_mtime(&layer.join("bin/x"), &tree.join("bin/x"));
        same_mtime(&base.join("hidden/f"), &tree.join("hidden/f"));
        // A symlink in the tree where the base has a file: not followed.
        std::os::unix::fs::symlink("/etc/passwd", tree.join("etc/link")).expect("symlink");
        write(&base.join("etc/link"), b"l");
        // The dirs' times, which linking over their entries must not change.
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        for d in ["etc", "bin"] {
            std::fs::File::open(tree.join(d))
                .and_then(|f| f.set_modified(old))
                .expect("set mtime");
        }
        let r = link_identical(&tree, &[&layer, &base]).expect("link");
        for d in ["etc", "bin"] {
            let m = std::fs::metadata(tree.join(d)).and_then(|m| m.modified());
            assert_eq!(m.ok(), Some(old), "{d}'s time changed");
        }
        let ino = |p: &Path| std::fs::metadata(p).expect("stat").ino();
        assert_eq!(ino(&tree.join("etc/same")), ino(&base.join("etc/same")));
        assert_eq!(
            ino(&tree.join("bin/x")),
            ino(&layer.join("bin/x")),
            "the layer's, on top"
        );
        assert_ne!(
            ino(&tree.join("etc/changed")),
            ino(&base.join("etc/changed"))
        );
        assert_ne!(
            ino(&tree.join("hidden/f")),
            ino(&base.join("hidden/f")),
            "hidden by the layer"
        );
        assert!(std::fs::symlink_metadata(tree.join("etc/link"))
            .expect("stat")
            .is_symlink());
        assert_eq!(r.files, 2, "{r:?}");
        assert_eq!(
            std::fs::read(tree.join("etc/changed")).expect("read"),
            b"new"
        );
        assert!(std::fs::read_dir(tree.join("etc"))
            .expect("ls")
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(".sifbox-link-")));
    }

    #[test]
    fn a_different_mode_is_not_linked() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().expect("tempdir");
        let (base, tree) = (t.path().join("base"), t.path().join("tree"));
        write(&base.join("f"), b"same");
        write(&tree.join("f"), b"same");
        same_mtime(&base.join("f"), &tree.join("f"));
        std::fs::set_permissions(tree.join("f"), std::fs::Permissions::from_mode(0o4755))
            .expect("chmod");
        assert_eq!(link_identical(&tree, &[&base]).expect("link").files, 0);
    }
}
