//! The runtime dir: where live sandboxes keep their state, and how dead ones
//! are found and removed.
//!
//! `$SIFBOX_RUNTIME` (default `$XDG_RUNTIME_DIR/sifbox`, else
//! `/dev/shm/sifbox-<uid>` where /dev/shm is a tmpfs, else
//! `/tmp/sifbox-<uid>`) holds `sandboxes/NAME/{lock, state.json,
//! control.sock, m/}`.
//!
//! A name is reserved by a dir made under a name no sandbox can have
//! (`+new-PID-START-RAND`, after its maker), with its `lock` file made and
//! locked shared inside, then renamed to `NAME` with `RENAME_NOREPLACE`:
//! the dir never exists under its name without a holder of its lock. The
//! client holds that lock until the supervisor reports anything, the outer
//! supervisor from its first moments to its exit. So a sandbox is alive
//! exactly while its lock is held, which a killed client or supervisor
//! stops at once (the kernel drops an flock with its last fd); who finds it
//! free (taking it exclusively) may remove the dir, and does so while
//! holding it.
//!
//! It is node-local and private to the caller (0700). A memory file system
//! is preferred: every sandbox creates and removes a few entries there, and
//! on a disk file system (with online discard, say) that costs more than the
//! rest of starting a sandbox.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

pub(crate) mod error;
pub use error::{DirProblem, RuntimeError};

/// A dir of an older sifbox (no lock file) without state.json younger than
/// this may be a sandbox being created.
const CREATION_GRACE: Duration = Duration::from_secs(60);

/// The lock file of a sandbox's dir (see the module docs).
pub const LOCK: &str = "lock";

/// The prefix of reservations not yet renamed to their name: `+` is no
/// character of a sandbox name.
const RESERVING: &str = "+new-";

/// How many other names the default runtime dir falls back to, in order
/// (`sifbox-UID.1` ... `.8`), when another user holds `sifbox-UID`.
const FALLBACKS: usize = 8;

/// The runtime dir, opened once per process and checked by its
/// descriptor; everything below it is reached through that descriptor
/// (`/proc/self/fd/N/...`), never through its path again.
#[derive(Debug, Clone)]
pub struct Root {
    fd: Arc<OwnedFd>,
    /// Where it is, for messages and records.
    path: PathBuf,
    /// `/proc/self/fd/N`: how this process reaches it.
    at: PathBuf,
}

impl Root {
    /// The dir (already checked) open as `fd`, found at `path`.
    fn new(fd: OwnedFd, path: PathBuf) -> Result<Root, RuntimeError> {
        match rustix::fs::mkdirat(&fd, "sandboxes", rustix::fs::Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(RuntimeError::Sandboxes {
                    path,
                    source: e.into(),
                })
            }
        }
        let at = sifbox_sys::fd_path(fd.as_fd());
        Ok(Root {
            fd: Arc::new(fd),
            path,
            at,
        })
    }

    /// A dir the caller names (`$SIFBOX_RUNTIME`, a test's): made when
    /// missing, then opened and checked by its descriptor: it must be the
    /// caller's and not writable by others.
    pub fn open(path: &Path, from: &str) -> Result<Root> {
        let bad = |problem| -> Error {
            RuntimeError::Named {
                path: path.to_path_buf(),
                from: from.to_string(),
                problem,
            }
            .into()
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|e| bad(DirProblem::Create(e)))?;
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| bad(DirProblem::Open(e.into())))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| bad(DirProblem::Stat(e.into())))?;
        if st.st_uid != rustix::process::geteuid().as_raw() {
            return Err(bad(DirProblem::Owner(st.st_uid)));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(bad(DirProblem::WritableByOthers));
        }
        rustix::fs::access(
            path,
            rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
        )
        .map_err(|e| bad(DirProblem::NotWritable(e.into())))?;
        Root::new(fd, path.to_path_buf()).map_err(|e| bad(DirProblem::Unusable(Box::new(e))))
    }

    /// Where the dir is, for messages and records (not for reaching it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How this process reaches the dir: `/proc/self/fd/N`.
    pub fn at(&self) -> &Path {
        &self.at
    }

    /// The dir's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `shown` (a path under [`Root::path`], as records keep them) as this
    /// process reaches it: through the descriptor. Another path is kept.
    pub fn reach(&self, shown: &Path) -> PathBuf {
        match shown.strip_prefix(&self.path) {
            Ok(rest) => self.at.join(rest),
            Err(_) => shown.to_path_buf(),
        }
    }

    /// `reached` (a path under [`Root::at`]) as records show it.
    pub fn shown(&self, reached: &Path) -> PathBuf {
        match reached.strip_prefix(&self.at) {
            Ok(rest) => self.path.join(rest),
            Err(_) => reached.to_path_buf(),
        }
    }
}

/// The runtime root for the current user, opened once per process (later
/// calls get the same descriptor).
pub fn root() -> Result<Root> {
    static ROOT: OnceLock<Root> = OnceLock::new();
    if let Some(r) = ROOT.get() {
        return Ok(r.clone());
    }
    let r = open_root()?;
    Ok(ROOT.get_or_init(|| r).clone())
}

/// Which rule chooses the runtime dir (see the module docs): [`root`]
/// opens what it names, and `sifbox doctor` says which it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// `$SIFBOX_RUNTIME`.
    Named(PathBuf),
    /// `$XDG_RUNTIME_DIR/sifbox`.
    Xdg(PathBuf),
    /// `sifbox-UID` (or a fallback `sifbox-UID.N`) in a dir shared by all
    /// users: /dev/shm where it is a tmpfs, else the temp dir.
    Default { base: PathBuf },
}

impl Rule {
    /// The rule for this process's environment.
    pub fn current() -> Rule {
        if let Some(p) = std::env::var_os("SIFBOX_RUNTIME").filter(|p| !p.is_empty()) {
            return Rule::Named(PathBuf::from(p));
        }
        if let Some(p) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
            return Rule::Xdg(PathBuf::from(p).join("sifbox"));
        }
        let base = if is_tmpfs(Path::new("/dev/shm")) {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        Rule::Default { base }
    }

    /// What chose `at` (the dir [`root`] opened by this rule), for people.
    pub fn describe(&self, at: &Path) -> String {
        match self {
            Rule::Named(_) => "from $SIFBOX_RUNTIME".into(),
            Rule::Xdg(_) => "from $XDG_RUNTIME_DIR".into(),
            Rule::Default { base } => {
                let uid = rustix::process::geteuid().as_raw();
                let first = base.join(format!("sifbox-{uid}"));
                let why = if base == Path::new("/dev/shm") {
                    "/dev/shm is a tmpfs"
                } else {
                    "/dev/shm is no tmpfs"
                };
                if at == first {
                    format!("the default: $SIFBOX_RUNTIME and $XDG_RUNTIME_DIR unset, {why}")
                } else {
                    format!(
                        "a fallback of the default: {} is not yours alone",
                        first.display()
                    )
                }
            }
        }
    }
}

fn open_root() -> Result<Root> {
    match Rule::current() {
        Rule::Named(p) => Root::open(&p, "SIFBOX_RUNTIME"),
        Rule::Xdg(path) => {
            let fd = sifbox_sys::private_dir(rustix::fs::CWD, &path, true).map_err(|source| {
                RuntimeError::Xdg {
                    path: path.clone(),
                    source,
                }
            })?;
            Ok(Root::new(fd, path)?)
        }
        Rule::Default { base } => default_root(&base),
    }
}

/// The default runtime dir in `base` (shared by all users: /dev/shm,
/// /tmp): `sifbox-UID`, or when that is not the caller's alone (another
/// user made it first, or put a symlink there), the first of
/// `sifbox-UID.1` ... `.8` that is, so that every command finds the same
/// one. An existing dir of the caller's is preferred to making one.
fn default_root(base: &Path) -> Result<Root> {
    let uid = rustix::process::geteuid().as_raw();
    let first = base.join(format!("sifbox-{uid}"));
    let fail = |problem| -> Error {
        RuntimeError::Default {
            first: first.clone(),
            problem,
        }
        .into()
    };
    let parent = rustix::fs::open(
        base,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| {
        fail(DirProblem::Base {
            base: base.to_path_buf(),
            source: e.into(),
        })
    })?;
    let names: Vec<String> = std::iter::once(format!("sifbox-{uid}"))
        .chain((1..=FALLBACKS).map(|i| format!("sifbox-{uid}.{i}")))
        .collect();
    let mut refused: Vec<String> = Vec::new();
    for create in [false, true] {
        for name in &names {
            match sifbox_sys::private_dir(parent.as_fd(), Path::new(name), create) {
                Ok(fd) => {
                    let path = base.join(name);
                    if let Some(why) = refused.first() {
                        tracing::warn!(
                            "the runtime dir {why}: using {} instead (set XDG_RUNTIME_DIR to a directory of your own)",
                            path.display()
                        );
                    }
                    return Ok(Root::new(fd, path)?);
                }
                Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    let why = match sifbox_sys::NotPrivate::of(&e) {
                        Some(n) => format!("{}/{n}", base.display()),
                        None => format!("{}/{name}: {e}", base.display()),
                    };
                    if !refused.contains(&why) {
                        refused.push(why);
                    }
                }
            }
        }
    }
    Err(fail(DirProblem::NoneOurs {
        fallbacks: FALLBACKS,
        refused,
    }))
}

/// The runtime dir `held` (a path through its descriptor, opened in the
/// mount namespace this process has just left) as a path of this one,
/// where mounts can be made on it: `shown` (where it was, resolved before
/// leaving) looked up again, which must lead to the very same directory
/// (device and inode), or the start fails.
pub fn same_dir_here(held: &Path, shown: &Path) -> Result<PathBuf> {
    let want = rustix::fs::stat(held).map_err(|e| Error::io(format!("{}", held.display()), e))?;
    let here = sifbox_sys::beneath::open_dir_path(rustix::fs::CWD, shown)
        .map_err(|e| Error::io(format!("opening {}", shown.display()), e))?;
    let got = rustix::fs::fstat(&here).map_err(|e| Error::io(format!("{}", shown.display()), e))?;
    if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino) {
        return Err(RuntimeError::Swapped(shown.to_path_buf()).into());
    }
    Ok(shown.to_path_buf())
}

/// Whether `path` is on a tmpfs.
fn is_tmpfs(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type == TMPFS_MAGIC)
}

/// What a live sandbox records about itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub name: String,
    /// Host pid of the outer supervisor.
    pub supervisor_pid: i32,
    /// Its start time (field 22 of /proc/PID/stat), against pid reuse.
    pub supervisor_start: u64,
    /// Unix seconds.
    pub created: u64,
    pub rootfs: PathBuf,
    pub oneshot: bool,
    /// Where its sandbox.json is.
    #[serde(default)]
    pub evidence: Option<PathBuf>,
    /// As the caller named the image.
    #[serde(default)]
    pub image: String,
    /// The image's digest, when it came from the store (who uses an image
    /// that `sifbox image rm` is asked to remove).
    #[serde(default)]
    pub digest: Option<String>,
    /// How its limits are enforced.
    #[serde(default)]
    pub limits: crate::limits::Enforcement,
    /// Made by a sifbox command for its own work (see
    /// [`crate::StartOptions::hidden`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hidden: bool,
}

/// Start time of `pid` in clock ticks since boot, if it exists and has not
/// exited (a zombie waiting to be reaped counts as gone).
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields after the command name start at field 3 (state); start time is
    // field 22.
    let mut fields = after.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the supervisor recorded in `state` is still running.
pub fn is_alive(state: &State) -> bool {
    process_start_time(state.supervisor_pid) == Some(state.supervisor_start)
}

/// Path of a sandbox's dir, through the root's descriptor.
pub fn sandbox_dir(root: &Root, name: &str) -> PathBuf {
    root.at().join("sandboxes").join(name)
}

/// The name of a sandbox, held: its dir exists and its lock is held
/// shared through `lock` for as long as this lives.
#[derive(Debug)]
pub struct Reservation {
    pub dir: PathBuf,
    pub lock: std::fs::File,
    /// Device and inode of the lock file, for the supervisor to check that
    /// it locks the same one.
    pub lock_id: (u64, u64),
}

/// Reserves `name` (see the module docs): a fresh dir under its name
/// whose lock this process holds. A dead sandbox of that name (lock free)
/// is removed first; a live one is an error.
pub fn reserve(root: &Root, name: &str) -> Result<Reservation> {
    let sandboxes = root.at().join("sandboxes");
    let dir = sandbox_dir(root, name);
    // Named after its maker (pid and start time): one whose maker is gone
    // is known dead at once.
    let me = i32::try_from(std::process::id()).unwrap_or_default();
    let tmp = sandboxes.join(format!(
        "{RESERVING}{me}-{}-{}",
        process_start_time(me).unwrap_or_default(),
        crate::random_id(6)
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .ctx(|| format!("creating {}", tmp.display()))?;
    let made = (|| {
        let lock = sifbox_sys::lockfile::lock(
            &tmp.join(LOCK),
            sifbox_sys::lockfile::Kind::Shared,
            false,
            true,
            0o600,
        )
        .ctx(|| format!("locking {}/{LOCK}", tmp.display()))?
        .ok_or_else(|| RuntimeError::LockedByAnother(tmp.join(LOCK)))?;
        let st = lock
            .metadata()
            .ctx(|| format!("{}/{LOCK}", tmp.display()))?;
        Ok::<_, Error>((lock, (st.dev(), st.ino())))
    })();
    let (lock, lock_id) = match made {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    // Twice at most: a dead sandbox in the way is removed once.
    for _ in 0..2 {
        match rustix::fs::renameat_with(
            rustix::fs::CWD,
            &tmp,
            rustix::fs::CWD,
            &dir,
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            Ok(()) => return Ok(Reservation { dir, lock, lock_id }),
            Err(rustix::io::Errno::EXIST) => {
                if remove_if_dead(&dir)? {
                    continue;
                }
                break;
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(Error::io(format!("creating {}", dir.display()), e));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Err(RuntimeError::NameTaken(name.to_string()).into())
}

/// Whether the sandbox in `dir` is alive: its lock is held, or (a dir of
/// an older sifbox, without a lock file) its recorded supervisor runs or
/// it is younger than [`CREATION_GRACE`] without a record.
fn dir_alive(dir: &Path, state: Option<&State>) -> bool {
    match sifbox_sys::lockfile::is_held(&dir.join(LOCK)) {
        Ok(true) => return true,
        Ok(false) if dir.join(LOCK).exists() => return false,
        Ok(false) => {}
        // Cannot tell: not dead for sure.
        Err(_) => return true,
    }
    match state {
        Some(s) => is_alive(s),
        None => {
            std::fs::symlink_metadata(dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .unwrap_or_default()
                < CREATION_GRACE
        }
    }
}

/// Removes the dir of a dead sandbox, holding its lock exclusively while it
/// does (so no supervisor of it can start holding it); returns whether it
/// was dead (and is gone).
pub fn remove_if_dead(dir: &Path) -> Result<bool> {
    let lock = dir.join(LOCK);
    let held = match sifbox_sys::lockfile::lock(
        &lock,
        sifbox_sys::lockfile::Kind::Exclusive,
        false,
        false,
        0,
    ) {
        Ok(Some(f)) => Some(f),
        Ok(None) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(format!("locking {}", lock.display()), e)),
    };
    if held.is_none() && dir_alive(dir, read_state(dir).as_ref()) {
        return Ok(false);
    }
    remove_dir(dir)?;
    drop(held);
    Ok(true)
}

/// Writes state.json. It is written once, right after the dir is made; a
/// reader that finds it missing or partial treats the sandbox as being
/// created (or, once older than a minute, as dead).
pub fn write_state(dir: &Path, state: &State) -> Result<()> {
    let path = dir.join("state.json");
    let data = serde_json::to_vec_pretty(state)
        .map_err(|e| Error::io("encoding state", std::io::Error::other(e)))?;
    std::fs::write(&path, data).ctx(|| format!("writing {}", path.display()))
}

/// Reads a sandbox's state.json.
pub fn read_state(dir: &Path) -> Option<State> {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).ok()?).ok()
}

/// A sandbox found by [`scan`].
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub dir: PathBuf,
    pub state: Option<State>,
    pub alive: bool,
}

/// Lists the sandboxes under `root`.
pub fn scan(root: &Root) -> Result<Vec<Entry>> {
    let dir = root.at().join("sandboxes");
    let mut out = Vec::new();
    for ent in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
        let ent = ent.ctx(|| format!("listing {}", dir.display()))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.starts_with(RESERVING) {
            continue;
        }
        let path = ent.path();
        let state = read_state(&path);
        let alive = dir_alive(&path, state.as_ref());
        out.push(Entry {
            name,
            dir: path,
            state,
            alive,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Removes the runtime dirs of sandboxes whose supervisor is gone; returns
/// their names. Their processes died with their supervisor (parent-death
/// signals and the pid namespace) and their mounts with their namespace, so
/// only the dir is left to remove.
pub fn reap_dead(root: &Root) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for e in scan(root)? {
        if !e.alive && remove_if_dead(&e.dir)? {
            removed.push(e.name);
        }
    }
    // Reservations their maker did not finish (killed before the rename).
    let dir = root.at().join("sandboxes");
    for ent in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
        let Ok(ent) = ent else { continue };
        if !ent.file_name().to_string_lossy().starts_with(RESERVING) {
            continue;
        }
        let path = ent.path();
        // Its maker makes the lock file in it, then locks it, then renames
        // it: while the maker lives, it may be between those steps.
        let name = ent.file_name().to_string_lossy().into_owned();
        let mut maker = name[RESERVING.len()..].splitn(3, '-');
        let (pid, start) = (
            maker.next().and_then(|p| p.parse::<i32>().ok()),
            maker.next().and_then(|t| t.parse::<u64>().ok()),
        );
        if let (Some(pid), Some(start)) = (pid, start) {
            if process_start_time(pid) == Some(start) {
                continue;
            }
        }
        let lock = path.join(LOCK);
        match sifbox_sys::lockfile::lock(
            &lock,
            sifbox_sys::lockfile::Kind::Exclusive,
            false,
            false,
            0,
        ) {
            Ok(Some(held)) => {
                remove_dir(&path)?;
                drop(held);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => remove_dir(&path)?,
            _ => {}
        }
    }
    Ok(removed)
}

/// Takes the supervisor's own shared hold on its sandbox's lock (see the
/// module docs): the lock file in `dir` must be the one the client made
/// (`lock_id`), which it still holds, so nobody can have removed it.
pub fn hold(dir: &Path, lock_id: (u64, u64)) -> Result<std::fs::File> {
    let path = dir.join(LOCK);
    let f = sifbox_sys::lockfile::lock(&path, sifbox_sys::lockfile::Kind::Shared, false, false, 0)
        .ctx(|| format!("locking {}", path.display()))?
        .ok_or_else(|| RuntimeError::TakenByRemover(path.clone()))?;
    let st = f.metadata().ctx(|| format!("{}", path.display()))?;
    if (st.dev(), st.ino()) != lock_id {
        return Err(RuntimeError::NotOurLock(path).into());
    }
    Ok(f)
}

/// Removes a sandbox's runtime dir; a dir already gone is fine. A dir
/// named by a descriptor (`/proc/self/fd/N`, as the supervisor has its
/// own) is removed as the entry of its parent, reached from it.
pub fn remove_dir(dir: &Path) -> Result<()> {
    if dir.parent() == Some(Path::new("/proc/self/fd")) {
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let name = match std::fs::read_link(dir) {
            Ok(target) => target,
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(Error::io(format!("reading {}", dir.display()), e)),
        };
        let Some(name) = name.file_name().map(PathBuf::from) else {
            return Ok(());
        };
        if name.to_string_lossy().ends_with(" (deleted)") {
            return Ok(());
        }
        let parent = rustix::fs::open(
            dir.join(".."),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::io(format!("opening the parent of {}", dir.display()), e))?;
        let parent = cap_std::fs::Dir::from_std_file(std::fs::File::from(parent));
        return match parent.remove_dir_all(&name) {
            Ok(()) => Ok(()),
            Err(e) if gone(&e) => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", name.display()), e)),
        };
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_readable() {
        let me = i32::try_from(std::process::id()).expect("pid");
        assert!(process_start_time(me).is_some());
        assert!(process_start_time(i32::MAX).is_none());
    }

    #[test]
    fn a_reservation_is_alive_while_held_and_dead_at_once_after() {
        let t = tempfile::tempdir().expect("tempdir");
        let root = Root::open(t.path(), "a test").expect("root");
        let r = reserve(&root, "x").expect("reserve");
        assert!(reserve(&root, "x").is_err(), "a held name is taken");
        let e = scan(&root).expect("scan");
        assert_eq!((e.len(), e[0].alive), (1, true), "{e:?}");
        // A second holder (the supervisor) keeps it alive without the first.
        let held = hold(&r.dir, r.lock_id).expect("hold");
        drop(r.lock);
        assert!(scan(&root).expect("scan")[0].alive);
        drop(held);
        // No state.json, no holder: dead now, not after a grace period.
        assert!(!scan(&root).expect("scan")[0].alive);
        let again = reserve(&root, "x").expect("the dead one is replaced");
        assert!(
            hold(&again.dir, r.lock_id).is_err(),
            "another reservation's lock"
        );
        drop(again);
        assert_eq!(reap_dead(&root).expect("reap"), vec!["x".to_string()]);
        assert!(std::fs::read_dir(root.path().join("sandboxes"))
            .expect("ls")
            .next()
            .is_none());
    }

    #[test]
    fn scan_and_reap() {
        let t = tempfile::tempdir().expect("tempdir");
        let root = Root::open(t.path(), "a test").expect("root");
        let me = i32::try_from(std::process::id()).expect("pid");
        let live = State {
            name: "live".into(),
            supervisor_pid: me,
            supervisor_start: process_start_time(me).expect("start"),
            created: 0,
            rootfs: "/".into(),
            oneshot: true,
            evidence: None,
            image: String::new(),
            digest: None,
            limits: crate::limits::Enforcement::default(),
            hidden: false,
        };
        let dead = State {
            name: "dead".into(),
            supervisor_start: 1,
            ..live.clone()
        };
        for s in [&live, &dead] {
            let d = sandbox_dir(&root, &s.name);
            std::fs::create_dir(&d).expect("mkdir");
            write_state(&d, s).expect("state");
        }
        // A fresh dir without state is assumed to be in creation.
        std::fs::create_dir(sandbox_dir(&root, "creating")).expect("mkdir");
        let removed = reap_dead(&root).expect("reap");
        assert_eq!(removed, vec!["dead".to_string()]);
        let names: Vec<_> = scan(&root)
            .expect("scan")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec!["creating".to_string(), "live".to_string()]);
    }

    #[test]
    fn a_default_dir_not_ours_alone_is_passed_over_and_found_again() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().expect("tempdir");
        let uid = rustix::process::geteuid().as_raw();
        let first = t.path().join(format!("sifbox-{uid}"));
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, &first).expect("symlink");
        let r = default_root(t.path()).expect("a fallback");
        assert_eq!(r.path(), t.path().join(format!("sifbox-{uid}.1")));
        assert!(
            !elsewhere.join("sandboxes").exists(),
            "nothing is made through the link"
        );
        // Writable by others: passed over too; the same fallback is found.
        std::fs::remove_file(&first).expect("rm");
        std::fs::create_dir(&first).expect("mkdir");
        std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(default_root(t.path()).expect("again").path(), r.path());
        // Gone: the existing fallback, which may hold live sandboxes, stays
        // the one found.
        std::fs::remove_dir(&first).expect("rmdir");
        assert_eq!(default_root(t.path()).expect("again").path(), r.path());
        // All taken: one error naming the first.
        let t = tempfile::tempdir().expect("tempdir");
        for i in 0..=FALLBACKS {
            let name = match i {
                0 => format!("sifbox-{uid}"),
                i => format!("sifbox-{uid}.{i}"),
            };
            std::os::unix::fs::symlink("/", t.path().join(name)).expect("symlink");
        }
        let e = default_root(t.path())
            .expect_err("none is ours")
            .to_string();
        assert!(e.contains(&format!("sifbox-{uid} is a symlink")), "{e}");
        assert!(e.contains("XDG_RUNTIME_DIR"), "{e}");
    }

    #[test]
    fn a_dir_named_by_its_descriptor_is_removed() {
        let t = tempfile::tempdir().expect("tempdir");
        let root = Root::open(t.path(), "a test").expect("root");
        let r = reserve(&root, "x").expect("reserve");
        std::fs::write(r.dir.join("state.json"), "{}").expect("write");
        let fd = rustix::fs::open(
            &r.dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("open");
        let named = sifbox_sys::fd_path(fd.as_fd());
        remove_dir(&named).expect("removed");
        assert!(!t.path().join("sandboxes/x").exists());
        remove_dir(&named).expect("gone is fine");
    }

    #[test]
    fn paths_under_the_root_are_reached_through_its_descriptor() {
        let t = tempfile::tempdir().expect("tempdir");
        let root = Root::open(t.path(), "a test").expect("root");
        let d = sandbox_dir(&root, "x");
        assert!(d.starts_with("/proc/self/fd/"), "{}", d.display());
        assert_eq!(root.shown(&d), t.path().join("sandboxes/x"));
        assert_eq!(root.reach(&root.shown(&d)), d);
    }
}
