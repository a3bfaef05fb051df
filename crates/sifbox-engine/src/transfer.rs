//! Copying files and directories into and out of a sandbox (`sifbox cp`).
//!
//! Both directions move a tar stream through a pipe, so nothing is held
//! whole in memory. Archives keep symlinks as links (never followed) and
//! modes and mtimes; unpacking goes through `cap_std::fs::Dir` handles on
//! the destination, so no entry (a `..`, an absolute name, a symlink placed
//! earlier in the stream or already in the destination) can write outside
//! it. The sandbox side runs inside the sandbox; the host side runs as the
//! caller.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use cap_std::fs::Dir;

/// Writes a tar stream of `path` to `out`, its entries named
/// `name/...` (or `name` for a file), symlinks as links.
pub fn write_tar(path: &Path, name: &str, out: impl Write) -> std::io::Result<()> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        b.append_dir_all(name, path)?;
    } else {
        b.append_path_with_name(path, name)?;
    }
    b.into_inner()?.flush()
}

/// Where an unpacked `name` lands: `dst/name` when `dst` is a directory,
/// else `dst` itself (its parent must exist), as `docker cp` does.
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
    let refuse = || std::io::Error::other(format!("refusing archive entry {}", raw.display()));
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
/// confined to the destination's directory. With `owner`, everything written
/// is chowned to it.
pub fn unpack_tar(
    input: impl Read,
    dst: &Path,
    name: &str,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let (base, rename) = placement(dst, name)?;
    let root = Dir::open_ambient_dir(&base, cap_std::ambient_authority())
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", base.display())))?;
    unpack_with(input, &root, |raw| entry_path(raw, name, &rename), owner)
}

/// Unpacks a tar stream whose entries are relative names into the directory
/// `dst`, made with its parents when missing, confined to it. Entries belong
/// to `owner` when given, else to the caller (root inside a sandbox).
pub fn extract_tar(input: impl Read, dst: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    let root = Dir::open_ambient_dir(dst, cap_std::ambient_authority())?;
    let relative = |raw: &Path| -> std::io::Result<PathBuf> {
        let mut out = PathBuf::new();
        for c in raw.components() {
            match c {
                Component::Normal(n) => out.push(n),
                Component::CurDir => {}
                _ => {
                    return Err(std::io::Error::other(format!(
                        "refusing archive entry {}",
                        raw.display()
                    )))
                }
            }
        }
        Ok(out)
    };
    unpack_with(input, &root, relative, owner)
}

fn unpack_with(
    input: impl Read,
    root: &Dir,
    map: impl Fn(&Path) -> std::io::Result<PathBuf>,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let mut archive = tar::Archive::new(input);
    let mut dirs: Vec<(PathBuf, u32, u64)> = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let rel = map(&raw)?;
        if rel.as_os_str().is_empty() {
            // `./`: the destination itself, which exists.
            continue;
        }
        let header = entry.header();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let mtime = header.mtime().unwrap_or(0);
        let kind = header.entry_type();
        let (parent, file) = split(&rel)?;
        if kind.is_dir() {
            root.create_dir_all(&rel)?;
            dirs.push((rel.clone(), mode, mtime));
            if let Some((uid, gid)) = owner {
                let (p, f) = split(&rel)?;
                let pd = open_parent(root, &p)?;
                chown(&pd, &f, uid, gid)?;
            }
            continue;
        }
        let dir = open_parent(root, &parent)?;
        // Whatever is there (a symlink above all) is replaced, not followed.
        if dir.symlink_metadata(&file).is_ok_and(|m| !m.is_dir()) {
            dir.remove_file(&file)?;
        }
        if kind.is_symlink() {
            let target = entry.link_name()?.ok_or_else(|| {
                std::io::Error::other(format!("symlink {} has no target", raw.display()))
            })?;
            rustix::fs::symlinkat(target.as_ref(), &dir, &file)?;
        } else if kind.is_hard_link() {
            let target = entry.link_name()?.ok_or_else(|| {
                std::io::Error::other(format!("hard link {} has no target", raw.display()))
            })?;
            let target = map(&target)?;
            root.hard_link(&target, &dir, &file)?;
            continue;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            let mut f = dir.create(&file)?;
            std::io::copy(&mut entry, &mut f)?;
            rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(mode))?;
        } else {
            tracing::debug!("skipping special file {}", raw.display());
            continue;
        }
        if let Some((uid, gid)) = owner {
            chown(&dir, &file, uid, gid)?;
        }
        set_mtime(&dir, &file, mtime)?;
    }
    // Read what follows the end-of-archive marker (tar pads its output to
    // whole records), so that the writer never sees a closed pipe.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink())?;
    // Directories last, deepest first: their modes may forbid writing and
    // writing into them moves their mtimes.
    for (rel, mode, mtime) in dirs.iter().rev() {
        let (parent, file) = split(rel)?;
        let dir = open_parent(root, &parent)?;
        rustix::fs::chmodat(
            &dir,
            &file,
            rustix::fs::Mode::from_raw_mode(*mode),
            rustix::fs::AtFlags::empty(),
        )?;
        set_mtime(&dir, &file, *mtime)?;
    }
    Ok(())
}

/// Writes a tar stream of `/` as this process sees it: owners numeric,
/// symlinks as links, the contents of every other mount left out (a mount
/// point that is a directory stays as an empty one; one that is a file is
/// left out), sockets skipped.
pub fn write_root_tar(out: impl Write) -> std::io::Result<()> {
    let mounts = mount_points()?;
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
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
            b.append_path_with_name(&path, name)?;
            if ft.is_dir() && !mounted {
                stack.push(path);
            }
        }
    }
    b.into_inner()?.flush()
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

fn open_parent(root: &Dir, parent: &Path) -> std::io::Result<Dir> {
    if parent.as_os_str().is_empty() {
        root.try_clone()
    } else {
        root.open_dir(parent)
    }
}

fn chown(dir: &Dir, file: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    rustix::fs::chownat(
        dir.as_fd(),
        file,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

fn set_mtime(dir: &Dir, file: &Path, mtime: u64) -> std::io::Result<()> {
    let t = rustix::fs::Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        dir.as_fd(),
        file,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
