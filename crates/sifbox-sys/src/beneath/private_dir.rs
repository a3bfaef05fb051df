//! A directory that is the caller's alone, opened once and checked by the
//! descriptor: what sifbox keeps in a shared parent (`/dev/shm`, `/tmp`)
//! is used through that descriptor, never through a path another user
//! could have pre-created, or raced a symlink into.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// A directory that exists but is not private to the caller: another
/// user's, a symlink, not a directory, or open to others. Carried inside
/// the `io::Error` [`private_dir`] returns (`ErrorKind::PermissionDenied`);
/// [`NotPrivate::of`] finds it again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {why}", path.display())]
pub struct NotPrivate {
    pub path: PathBuf,
    /// Its owner and mode, when it could be opened and checked.
    pub owner: Option<u32>,
    pub mode: Option<u32>,
    pub why: String,
}

impl NotPrivate {
    /// The [`NotPrivate`] inside `e`, if that is what `e` is.
    pub fn of(e: &std::io::Error) -> Option<&NotPrivate> {
        e.get_ref().and_then(|inner| inner.downcast_ref())
    }

    fn error(self) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, self)
    }
}

/// Opens (making it, mode 0700, when missing) the directory `name` under
/// `parent` (an absolute `name` ignores `parent`, as `openat` does) and
/// returns it open (`O_DIRECTORY|O_NOFOLLOW`, close-on-exec) once its
/// descriptor shows it is private to the caller: owned by the effective
/// uid, no symlink, and mode 0700. A directory of ours whose mode only
/// lets others read (0755, an umask's doing) is made 0700 through the
/// descriptor; one that others could write, or that is another user's,
/// is refused with a [`NotPrivate`] naming its owner and mode, and left
/// as it is. `create`: make it when missing (else a missing one is
/// `NotFound`).
pub fn private_dir(parent: BorrowedFd<'_>, name: &Path, create: bool) -> std::io::Result<OwnedFd> {
    if create {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let not_private = |owner, mode, why: &str| {
        NotPrivate {
            path: name.to_path_buf(),
            owner,
            mode,
            why: why.to_string(),
        }
        .error()
    };
    let dir = match rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(d) => d,
        // O_NOFOLLOW|O_DIRECTORY on a symlink: ENOTDIR (or ELOOP).
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            let st = rustix::fs::statat(parent, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok();
            let (owner, mode) = (st.map(|s| s.st_uid), st.map(|s| s.st_mode & 0o7777));
            let link = st.is_some_and(|s| {
                rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::Symlink
            });
            let why = match (link, owner) {
                (true, Some(o)) => format!("is a symlink (of uid {o})"),
                (_, Some(o)) => format!("is not a directory (of uid {o})"),
                _ => "is not a directory".to_string(),
            };
            return Err(not_private(owner, mode, &why));
        }
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&dir)?;
    let mode = st.st_mode & 0o7777;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(not_private(
            Some(st.st_uid),
            Some(mode),
            &format!(
                "belongs to uid {} (mode {mode:04o}), not to you (uid {me})",
                st.st_uid
            ),
        ));
    }
    if mode & 0o022 != 0 {
        return Err(not_private(
            Some(st.st_uid),
            Some(mode),
            &format!("is yours but others can write to it (mode {mode:04o})"),
        ));
    }
    if mode != 0o700 {
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700))?;
    }
    Ok(dir)
}

/// `/proc/self/fd/N` for `fd`: a path that names the directory `fd` is
/// open on without resolving any other path again (the kernel follows
/// the descriptor), for calls that take only a path (`bind`, `connect`).
pub fn fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Checks that no other user could swap `path` for another: every
/// directory above it (as given, and as it resolves) belongs to the caller
/// or root, and is writable by nobody else unless sticky (`/tmp`: there
/// only an entry's owner may rename it, and the entry is checked in turn);
/// a symlink on the way must be the caller's or root's too. Group write
/// counts only for a group other than the caller's own. Missing
/// components end the check (what is made later is the caller's). The
/// error (`PermissionDenied`, a [`NotPrivate`]) names the directory, its
/// owner and mode.
pub fn check_ancestors(path: &Path) -> std::io::Result<()> {
    use rustix::fs::{AtFlags, FileType};
    let me = rustix::process::geteuid().as_raw();
    let my_gid = rustix::process::getegid().as_raw();
    let trusted = |uid: u32| uid == me || uid == 0;
    let check = |p: &Path, is_last: bool| -> std::io::Result<bool> {
        let st = match rustix::fs::statat(rustix::fs::CWD, p, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let mode = st.st_mode & 0o7777;
        let bad = |why: String| {
            NotPrivate {
                path: p.to_path_buf(),
                owner: Some(st.st_uid),
                mode: Some(mode),
                why,
            }
            .error()
        };
        let kind = FileType::from_raw_mode(st.st_mode);
        // The dir itself is its user's to judge (a shared store's owner).
        if is_last && kind == FileType::Directory {
            return Ok(true);
        }
        if !trusted(st.st_uid) {
            let what = if kind == FileType::Symlink {
                "a symlink"
            } else {
                "a directory"
            };
            return Err(bad(format!(
                "is {what} of uid {} (mode {mode:04o}): that user could swap what lies beneath it",
                st.st_uid
            )));
        }
        if kind == FileType::Directory {
            let sticky = mode & 0o1000 != 0;
            let others = mode & 0o002 != 0 || (mode & 0o020 != 0 && st.st_gid != my_gid);
            if others && !sticky {
                return Err(bad(format!(
                    "is writable by other users (mode {mode:04o}, group {}): they could swap what lies beneath it",
                    st.st_gid
                )));
            }
        }
        Ok(true)
    };
    let walk = |full: &Path| -> std::io::Result<()> {
        let mut at = PathBuf::new();
        let parts: Vec<_> = full.components().collect();
        for (i, c) in parts.iter().enumerate() {
            at.push(c);
            if !check(&at, i + 1 == parts.len())? {
                break;
            }
        }
        Ok(())
    };
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    walk(&abs)?;
    // And where it resolves to, through whatever symlinks it has (checked
    // above to be trusted ones).
    let mut existing = abs.as_path();
    while !existing.exists() {
        match existing.parent() {
            Some(p) => existing = p,
            None => return Ok(()),
        }
    }
    let real = std::fs::canonicalize(existing)?;
    if real != existing {
        let rest = abs.strip_prefix(existing).unwrap_or(Path::new(""));
        walk(&real.join(rest))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn cwd() -> BorrowedFd<'static> {
        rustix::fs::CWD
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn makes_a_missing_dir_0700_and_opens_an_existing_one() {
        let t = tempfile::tempdir().expect("tempdir");
        let p = t.path().join("d");
        private_dir(cwd(), &p, true).expect("made");
        let md = std::fs::metadata(&p).expect("stat");
        assert_eq!(md.permissions().mode() & 0o7777, 0o700);
        private_dir(cwd(), &p, true).expect("opened again");
        assert_eq!(
            private_dir(cwd(), &t.path().join("missing"), false)
                .expect_err("not made")
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn refuses_a_symlink_and_a_dir_others_can_write() {
        let t = tempfile::tempdir().expect("tempdir");
        let target = t.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        let link = t.path().join("link");
        symlink(&target, &link).expect("symlink");
        let e = private_dir(cwd(), &link, true).expect_err("a symlink");
        let why = NotPrivate::of(&e)
            .map(|n| n.why.clone())
            .unwrap_or_default();
        assert!(why.starts_with("is a symlink"), "{why}");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = private_dir(cwd(), &target, true).expect_err("open to others");
        let n = NotPrivate::of(&e).expect("typed");
        assert_eq!(n.mode, Some(0o777));
        assert_eq!(mode_of(&target), 0o777, "left as it was");
        // Readable by others only: ours to make private.
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        private_dir(cwd(), &target, false).expect("made private");
        assert_eq!(mode_of(&target), 0o700);
    }

    #[test]
    fn ancestors_another_user_could_swap_are_found() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().expect("tempdir");
        let open = t.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        check_ancestors(&open.join("store/x")).expect("a private parent");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = check_ancestors(&open.join("store")).expect_err("world-writable, not sticky");
        assert!(e.to_string().contains("could swap"), "{e}");
        // The dir itself may be open: only what is above it counts.
        check_ancestors(&open).expect("the last one");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        check_ancestors(&open.join("store")).expect("sticky, as /tmp");
        // Through a symlink: where it leads is checked too.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&open, &link).expect("symlink");
        assert!(check_ancestors(&link.join("store")).is_err());
    }
}
