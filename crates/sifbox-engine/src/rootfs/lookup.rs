//! Looking a step's path up beneath the root being assembled (or one of
//! sifbox's mounts in it), creating what its [`Lookup`] allows, without
//! following anything out: the image is hostile.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sifbox_sys::beneath;

use super::error::{sys_err, Result, RootfsError};
use super::{relative, At, Base, Create, Lookup};

/// The root being assembled: the overlay mount and the mounts made on it.
#[derive(Debug)]
pub struct NewRoot {
    /// The overlay's root directory.
    pub(super) fd: OwnedFd,
    /// The mounts of [`Base`]s other than the root, once made.
    pub(super) mounts: HashMap<Base, OwnedFd>,
    /// The first empty read-only tmpfs that masks a directory: the others
    /// are clones of it (one superblock for all).
    pub(super) empty: Option<OwnedFd>,
    /// The writable, detached clones of the guarded binds, with where
    /// they go (see [`super::Step::Guarded`]).
    pub(super) guarded: Vec<(PathBuf, OwnedFd)>,
    /// The writable layer's dir that holds the overlay's upper and work
    /// dirs and the [`super::Step::LayerDir`]s.
    pub(super) layer: Option<OwnedFd>,
    /// The overlay's upper dir, for a sandbox whose layer is kept
    /// ([`crate::spec::SandboxSpec::keep_layer`]).
    pub upper: Option<OwnedFd>,
}

impl NewRoot {
    /// The root `fd` alone: no other mount made yet, no writable layer.
    pub(super) fn bare(fd: OwnedFd) -> Self {
        NewRoot {
            fd,
            mounts: HashMap::new(),
            empty: None,
            guarded: Vec::new(),
            layer: None,
            upper: None,
        }
    }

    /// The writable clones of the guarded binds, detached, each with the
    /// path in the sandbox where the guarded mount namespace shows it.
    pub fn take_guarded(&mut self) -> Vec<(PathBuf, OwnedFd)> {
        std::mem::take(&mut self.guarded)
    }

    pub(super) fn base(&self, b: Base) -> Option<BorrowedFd<'_>> {
        match b {
            Base::Root => Some(self.fd.as_fd()),
            other => self.mounts.get(&other).map(AsFd::as_fd),
        }
    }

    /// Resolves `at` to an `O_PATH` fd, creating what its lookup allows;
    /// `None` when an `IfPresent` path (or its mount) is absent. `source`
    /// is the kind of a bind's source, for `Create::LikeSource`.
    pub(super) fn resolve(&self, at: &At, source: Option<Create>) -> Result<Option<OwnedFd>> {
        let Some(base) = self.base(at.base) else {
            return match at.lookup {
                Lookup::IfPresent => Ok(None),
                _ => Err(RootfsError::NoMount { path: at.shown() }),
            };
        };
        match at.lookup {
            Lookup::Image(create) => {
                let kind = match (create, source) {
                    (Create::LikeSource, Some(k)) => k,
                    (Create::LikeSource, None) => Create::Dir,
                    (k, _) => k,
                };
                ensure_in_root(base, &at.path, kind, 0).map(Some)
            }
            Lookup::RealDir => real_dir(base, at).map(Some),
            Lookup::IfPresent => match beneath::open_beneath(base, &at.path, OFlags::PATH) {
                Ok(fd) => Ok(Some(fd)),
                Err(Errno::NOENT) => Ok(None),
                Err(e) => Err(sys_err(format!("opening {}", at.shown()))(e)),
            },
            Lookup::New(create) => {
                let (parent, name) = split_beneath(base, at)?;
                match create {
                    Create::Dir | Create::LikeSource => {
                        rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755))
                    }
                    Create::File => rustix::fs::openat(
                        &parent,
                        name,
                        OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::WRONLY
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o644),
                    )
                    .map(drop),
                }
                .map_err(sys_err(format!("creating {}", at.shown())))?;
                beneath::open_beneath(&parent, Path::new(name), OFlags::PATH)
                    .map(Some)
                    .map_err(sys_err(format!("opening {}", at.shown())))
            }
        }
    }
}

/// The directory a step's entry is made in: the base itself for a name
/// right beneath it, else one opened beneath it.
pub(super) enum Parent<'a> {
    Base(BorrowedFd<'a>),
    Opened(OwnedFd),
}

impl AsFd for Parent<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Parent::Base(b) => *b,
            Parent::Opened(o) => o.as_fd(),
        }
    }
}

/// The parent (strictly beneath `base`) and the last name of `at`.
pub(super) fn split_beneath<'a, 'b>(
    base: BorrowedFd<'b>,
    at: &'a At,
) -> Result<(Parent<'b>, &'a std::ffi::OsStr)> {
    let name = at
        .path
        .file_name()
        .ok_or_else(|| RootfsError::NotCreatable { path: at.shown() })?;
    let parent = at.path.parent().unwrap_or(Path::new(""));
    if parent.as_os_str().is_empty() {
        return Ok((Parent::Base(base), name));
    }
    let fd = beneath::open_beneath(base, parent, OFlags::PATH | OFlags::DIRECTORY)
        .map_err(sys_err(format!("opening the parent of {}", at.shown())))?;
    Ok((Parent::Opened(fd), name))
}

/// The image's own directory at `at` (no symlink on the way), made when
/// missing; a symlink or a non-directory fails the start, naming it.
fn real_dir(base: BorrowedFd<'_>, at: &At) -> Result<OwnedFd> {
    match beneath::open_beneath(base, &at.path, OFlags::PATH | OFlags::DIRECTORY) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(Errno::LOOP | Errno::NOTDIR | Errno::XDEV) => return Err(refuse(base, at)),
        Err(e) => return Err(sys_err(format!("opening {}", at.shown()))(e)),
    }
    let (parent, name) = split_beneath(base, at).map_err(|_| refuse(base, at))?;
    match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(sys_err(format!("creating {}", at.shown()))(e)),
    }
    beneath::open_beneath(&parent, Path::new(name), OFlags::PATH | OFlags::DIRECTORY).map_err(|e| {
        match e {
            Errno::LOOP | Errno::NOTDIR => refuse(base, at),
            e => sys_err(format!("opening {}", at.shown()))(e),
        }
    })
}

/// Why the image's `at` cannot be used: the first part of its path that is
/// a symlink or not a directory.
fn refuse(base: BorrowedFd<'_>, at: &At) -> RootfsError {
    let mut dir = rustix::io::fcntl_dupfd_cloexec(base, 3).ok();
    let mut shown = PathBuf::from("/");
    let mut what = "is not a directory".to_string();
    for part in at.path.iter() {
        shown.push(part);
        let Some(d) = &dir else { break };
        match rustix::fs::statat(d, part, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                let target = rustix::fs::readlinkat(d, part, Vec::new())
                    .map(|t| String::from_utf8_lossy(t.as_bytes()).into_owned())
                    .unwrap_or_else(|_| "?".into());
                what = format!("is a symbolic link (to {target})");
                break;
            }
            Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {
                what = "is not a directory".into();
                break;
            }
            Ok(_) => {
                dir =
                    beneath::open_beneath(d, Path::new(part), OFlags::PATH | OFlags::DIRECTORY).ok()
            }
            Err(_) => break,
        }
    }
    let mount = match at.path.iter().next() {
        Some(first) => format!("/{}", first.to_string_lossy()),
        None => "/".into(),
    };
    RootfsError::NotARealDir {
        path: shown.display().to_string(),
        why: what,
        mount,
        at: at.shown(),
    }
}

/// Opens (creating what is missing) `rel` beneath `root`, resolving every
/// symlink as if `root` were `/` (so an image's symlinks never lead out);
/// a dangling symlink is followed by creating its target. Returns an
/// `O_PATH` fd.
pub(super) fn ensure_in_root(
    root: BorrowedFd<'_>,
    rel: &Path,
    kind: Create,
    links: u32,
) -> Result<OwnedFd> {
    const MAX_LINKS: u32 = 40;
    let shown = || Path::new("/").join(rel).display().to_string();
    if links > MAX_LINKS {
        return Err(RootfsError::TooManyLinks { path: shown() });
    }
    let open = |p: &Path| {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        beneath::open_in_root(root, p, OFlags::PATH)
    };
    match open(rel) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(sys_err(format!("opening {} in the sandbox", shown()))(e)),
    }
    let name = rel
        .file_name()
        .ok_or_else(|| RootfsError::NotCreatable { path: shown() })?;
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let parent = if parent_rel.as_os_str().is_empty() {
        open(Path::new("")).map_err(sys_err("opening the sandbox root"))?
    } else {
        ensure_in_root(root, parent_rel, Create::Dir, links)?
    };
    // The parent was resolved inside the root; the new entry is created in
    // it by name, so nothing here follows a symlink.
    let made = match kind {
        Create::Dir | Create::LikeSource => {
            rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755))
        }
        Create::File => rustix::fs::openat(
            &parent,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map(drop),
    };
    match made {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            // A dangling symlink: create its target, resolved inside the
            // root like any other path.
            if let Ok(target) = rustix::fs::readlinkat(&parent, name, Vec::new()) {
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                let next = relative(&Path::new("/").join(parent_rel).join(target));
                return ensure_in_root(root, &next, kind, links + 1);
            }
        }
        Err(e) => return Err(sys_err(format!("creating {} in the sandbox", shown()))(e)),
    }
    open(rel).map_err(sys_err(format!("opening {} in the sandbox", shown())))
}
