//! The runtime dir: where live sandboxes keep their state, and how dead ones
//! are found and removed.
//!
//! `$SIFBOX_RUNTIME` (default `$XDG_RUNTIME_DIR/sifbox`, else
//! `/dev/shm/sifbox-<uid>` where /dev/shm is a tmpfs, else
//! `/tmp/sifbox-<uid>`) holds `sandboxes/NAME/{state.json, control.sock, m/}`.
//! It is node-local and private to the caller (0700). A memory file system
//! is preferred: every sandbox creates and removes a few entries there, and
//! on a disk file system (with online discard, say) that costs more than the
//! rest of starting a sandbox.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

/// A dir without state.json younger than this may be a sandbox being created.
const CREATION_GRACE: Duration = Duration::from_secs(60);

/// The runtime root for the current user.
pub fn root() -> Result<PathBuf> {
    let (path, from) = if let Some(p) = std::env::var_os("SIFBOX_RUNTIME").filter(|p| !p.is_empty())
    {
        (PathBuf::from(p), "SIFBOX_RUNTIME")
    } else if let Some(p) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        (PathBuf::from(p).join("sifbox"), "XDG_RUNTIME_DIR")
    } else {
        let uid = rustix::process::geteuid().as_raw();
        let base = if is_tmpfs(Path::new("/dev/shm")) {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        (base.join(format!("sifbox-{uid}")), "the default")
    };
    let bad = |why: String| Error::BadInput {
        what: format!("runtime dir {} (from {from})", path.display()),
        why,
        fix: "set SIFBOX_RUNTIME to a writable directory on a local file system".into(),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path.join("sandboxes"))
        .map_err(|e| bad(format!("cannot create it: {e}")))?;
    let meta = std::fs::metadata(&path).map_err(|e| bad(e.to_string()))?;
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(bad(format!("it belongs to uid {}, not to you", meta.uid())));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(bad("it is writable by others".into()));
    }
    rustix::fs::access(
        &path,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )
    .map_err(|e| bad(format!("not writable: {}", std::io::Error::from(e))))?;
    Ok(path)
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

/// Path of a sandbox's dir.
pub fn sandbox_dir(root: &Path, name: &str) -> PathBuf {
    root.join("sandboxes").join(name)
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
pub fn scan(root: &Path) -> Result<Vec<Entry>> {
    let dir = root.join("sandboxes");
    let mut out = Vec::new();
    for ent in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
        let ent = ent.ctx(|| format!("listing {}", dir.display()))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        let path = ent.path();
        let state = read_state(&path);
        let alive = match &state {
            Some(s) => is_alive(s),
            None => {
                // Being created right now, or left by a crash before state.json.
                let age = ent
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .unwrap_or_default();
                age < CREATION_GRACE
            }
        };
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
pub fn reap_dead(root: &Path) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for e in scan(root)? {
        if !e.alive {
            remove_dir(&e.dir)?;
            removed.push(e.name);
        }
    }
    Ok(removed)
}

/// Removes a sandbox's runtime dir; a dir already gone is fine.
pub fn remove_dir(dir: &Path) -> Result<()> {
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
    fn scan_and_reap() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("sandboxes")).expect("mkdir");
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
            limits: crate::limits::Enforcement::default(),
            hidden: false,
        };
        let dead = State {
            name: "dead".into(),
            supervisor_start: 1,
            ..live.clone()
        };
        for s in [&live, &dead] {
            let d = sandbox_dir(root.path(), &s.name);
            std::fs::create_dir(&d).expect("mkdir");
            write_state(&d, s).expect("state");
        }
        // A fresh dir without state is assumed to be in creation.
        std::fs::create_dir(sandbox_dir(root.path(), "creating")).expect("mkdir");
        let removed = reap_dead(root.path()).expect("reap");
        assert_eq!(removed, vec!["dead".to_string()]);
        let names: Vec<_> = scan(root.path())
            .expect("scan")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec!["creating".to_string(), "live".to_string()]);
    }
}
