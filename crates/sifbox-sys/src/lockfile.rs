//! Lock files that may be removed: flock on a file that is still the one
//! its path names.
//!
//! An flock belongs to an inode, not to a path. A lock file that is unlinked
//! while another process has it open but not yet locked lets that process
//! lock the unlinked inode, while a third one makes a new file at the path
//! and locks that: two holders of "the same" lock. So every locker here
//! re-checks, once it holds the lock, that the path still names the inode
//! it locked (`fstat` of its fd against a no-follow `stat` of the path) and
//! starts over when not; and a lock file is unlinked only by a process that
//! holds it exclusively and has made the same check ([`remove_if_unheld`]).
//! Then a holder's inode is always the one at the path, and the lock means
//! what it says. No `unsafe` here: it lives beside the rest of sifbox's
//! low-level file handling.

#![deny(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

use rustix::fs::FlockOperation;

/// How a lock is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// With other shared holders.
    Shared,
    /// Alone.
    Exclusive,
}

/// Whether `file` (open, locked) is still the file at `path`.
fn still_named(file: &File, path: &Path) -> io::Result<bool> {
    let held = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn flock(file: &File, kind: Kind, wait: bool) -> io::Result<bool> {
    let op = match (kind, wait) {
        (Kind::Shared, true) => FlockOperation::LockShared,
        (Kind::Shared, false) => FlockOperation::NonBlockingLockShared,
        (Kind::Exclusive, true) => FlockOperation::LockExclusive,
        (Kind::Exclusive, false) => FlockOperation::NonBlockingLockExclusive,
    };
    loop {
        match rustix::fs::flock(file, op) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) if !wait => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Locks the lock file at `path` (made with `mode` when `create` and
/// missing; never through a symlink), waiting for other holders when
/// `wait`. Returns the open, locked file (the lock lasts while it is
/// open), or `None` when `!wait` and another process holds the lock in a
/// way that excludes `kind`. Without `create`, a missing file is
/// `NotFound`.
pub fn lock(
    path: &Path,
    kind: Kind,
    wait: bool,
    create: bool,
    mode: u32,
) -> io::Result<Option<File>> {
    loop {
        let mut o = std::fs::OpenOptions::new();
        o.read(true)
            .custom_flags(libc_o_nofollow() | libc_o_cloexec())
            .mode(mode);
        if create {
            o.write(true).create(true).truncate(false);
        }
        let file = match o.open(path) {
            Ok(f) => f,
            // A group member of a shared store may read but not write.
            Err(e) if create && e.kind() == io::ErrorKind::PermissionDenied => {
                match std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc_o_nofollow() | libc_o_cloexec())
                    .open(path)
                {
                    Ok(f) => f,
                    Err(_) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if !flock(&file, kind, wait)? {
            return Ok(None);
        }
        if still_named(&file, path)? {
            return Ok(Some(file));
        }
        // Unlinked (and maybe replaced) between our open and our lock:
        // that inode means nothing any more.
        if !create && !path.exists() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
    }
}

/// Unlinks the lock file at `path` if nobody holds it; returns whether it
/// did. The file is locked exclusively and checked to still be the one at
/// `path` before it is unlinked, so no holder of it (who re-checks in
/// [`lock`]) ever holds an unlinked inode.
pub fn remove_if_unheld(path: &Path) -> io::Result<bool> {
    let file = match lock(path, Kind::Exclusive, false, false, 0) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    drop(file);
    Ok(true)
}

/// Whether some process holds the lock file at `path` (in any way); a
/// missing file is held by nobody. Takes and drops the lock exclusively
/// when free: a caller that acts on "not held" must take it with [`lock`]
/// and act while holding it.
pub fn is_held(path: &Path) -> io::Result<bool> {
    match lock(path, Kind::Exclusive, false, false, 0) {
        Ok(Some(_)) => Ok(false),
        Ok(None) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn libc_o_nofollow() -> i32 {
    libc::O_NOFOLLOW
}

fn libc_o_cloexec() -> i32 {
    libc::O_CLOEXEC
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn shared_holders_exclude_exclusive_and_removal() {
        let t = tempfile::tempdir().expect("tempdir");
        let p = t.path().join("k.lock");
        let a = lock(&p, Kind::Shared, true, true, 0o600)
            .expect("lock")
            .expect("held");
        let b = lock(&p, Kind::Shared, false, true, 0o600).expect("lock");
        assert!(b.is_some(), "shared with shared");
        assert!(lock(&p, Kind::Exclusive, false, true, 0o600)
            .expect("try")
            .is_none());
        assert!(is_held(&p).expect("held"));
        assert!(!remove_if_unheld(&p).expect("rm"), "held: kept");
        drop((a, b));
        assert!(!is_held(&p).expect("held"));
        assert!(remove_if_unheld(&p).expect("rm"));
        assert!(!p.exists());
        assert!(!remove_if_unheld(&p).expect("rm again"));
        assert!(matches!(
            lock(&p, Kind::Shared, false, false, 0),
            Err(e) if e.kind() == io::ErrorKind::NotFound
        ));
    }

    #[test]
    fn a_symlink_is_not_followed() {
        let t = tempfile::tempdir().expect("tempdir");
        let target = t.path().join("target");
        std::fs::write(&target, b"").expect("write");
        let link = t.path().join("l.lock");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(lock(&link, Kind::Exclusive, false, true, 0o600).is_err());
    }

    /// Lockers and a remover racing on one path: at no moment do two
    /// exclusive holders exist, although the file is unlinked and made
    /// again all the time.
    #[test]
    fn removal_never_lets_two_hold_exclusively() {
        let t = tempfile::tempdir().expect("tempdir");
        let p = Arc::new(t.path().join("race.lock"));
        let inside = Arc::new(AtomicUsize::new(0));
        let worst = Arc::new(AtomicUsize::new(0));
        let removed = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut hs = Vec::new();
        for _ in 0..4 {
            let (p, inside, worst) = (p.clone(), inside.clone(), worst.clone());
            hs.push(std::thread::spawn(move || {
                for _ in 0..400 {
                    let f = lock(&p, Kind::Exclusive, true, true, 0o600)
                        .expect("lock")
                        .expect("held");
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    worst.fetch_max(n, Ordering::SeqCst);
                    std::thread::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(f);
                }
            }));
        }
        {
            let (p, removed, stop) = (p.clone(), removed.clone(), stop.clone());
            hs.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if remove_if_unheld(&p).expect("rm") {
                        removed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        let remover = hs.pop().expect("remover");
        for h in hs {
            h.join().expect("join");
        }
        stop.store(true, Ordering::SeqCst);
        remover.join().expect("join");
        assert_eq!(worst.load(Ordering::SeqCst), 1, "two held the lock at once");
        assert!(removed.load(Ordering::SeqCst) > 0, "the remover never ran");
    }
}
