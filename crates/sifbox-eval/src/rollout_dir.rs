//! A rollout's dir on the host, by fd.
//!
//! The dir is bound at /logs in the rollout's sandbox, so whatever runs
//! there (the agent, and anything it leaves running while the verifier
//! runs) can replace any entry below it with a symlink, a FIFO or a dir of
//! its own at any moment. The host therefore never uses a path below the
//! rollout dir: it opens the dir and its subdirs once (`O_NOFOLLOW`), makes
//! files with `openat(O_CREAT|O_EXCL|O_NOFOLLOW)` after unlinking what is
//! there, renames with `renameat`, reads with `O_NOFOLLOW` and checks what
//! it opened with `fstat`. A dir the sandbox moves away is still the dir
//! the fd names, and it stays inside the rollout dir (the bind's mount
//! root, which nothing inside can leave by rename): a host write lands
//! there or fails, never elsewhere.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use serde::Serialize;
use sifbox_sys::beneath;

/// Tries at re-making `verifier/` before giving up on a sandbox that keeps
/// replacing it.
const REMAKE_TRIES: usize = 20;

/// The largest result.json read back.
const MAX_RESULT: u64 = 16 << 20;

/// Opens the directory at `path` without following a symlink there
/// ([`beneath::open_dir`]).
pub fn open_dir_nofollow(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(beneath::open_dir(rustix::fs::CWD, path)?)
}

/// A fresh, empty file `name` in `dir` (mode 0644), for writing: what is
/// there is unlinked, not followed ([`beneath::create_new`]).
pub fn create_file(dir: BorrowedFd<'_>, name: &str) -> std::io::Result<File> {
    beneath::create_new(dir, name, Mode::from_raw_mode(0o644))
}

fn temp_name(name: &str) -> String {
    format!(".{name}.tmp-{}", sifbox_engine::random_id(8))
}

/// Writes `value` as pretty JSON to `name` in `dir`: a temp file of ours
/// (`O_EXCL|O_NOFOLLOW`), then `renameat` over the name, which replaces
/// whatever entry is there without following it.
pub fn write_json_at<T: Serialize>(
    dir: BorrowedFd<'_>,
    name: &str,
    value: &T,
) -> std::io::Result<()> {
    let mut data = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    data.push(b'\n');
    let (tmp, fd) = loop {
        let tmp = temp_name(name);
        match rustix::fs::openat(
            dir,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        ) {
            Ok(fd) => break (tmp, fd),
            Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    };
    let written = rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o644))
        .map_err(std::io::Error::from)
        .and_then(|()| File::from(fd).write_all(&data))
        .and_then(|()| rustix::fs::renameat(dir, &tmp, dir, name).map_err(Into::into));
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
    }
    written
}

/// Reads the regular file `name` in `dir` (not followed, non-blocking, at
/// most `limit` bytes): None when it is absent or not a regular file of
/// at most `limit` bytes.
pub fn read_small(dir: BorrowedFd<'_>, name: &str, limit: u64) -> Option<Vec<u8>> {
    let (file, _) = beneath::open_regular(dir, name).ok()?;
    let mut data = Vec::new();
    file.take(limit + 1).read_to_end(&mut data).ok()?;
    (u64::try_from(data.len()).unwrap_or(u64::MAX) <= limit).then_some(data)
}

/// The result.json of the rollout dir at `path`, read by fd (a resumed
/// job's finished rollouts).
pub fn load_result(path: &Path) -> Option<crate::result::RolloutResult> {
    let dir = open_dir_nofollow(path).ok()?;
    let data = read_small(dir.as_fd(), crate::result::RESULT_FILE, MAX_RESULT)?;
    serde_json::from_slice(&data).ok()
}

/// Copies the host file `src` (not below any rollout dir) to a fresh file
/// `name` in `dir`.
pub fn copy_in(dir: BorrowedFd<'_>, name: &str, src: &Path) -> std::io::Result<()> {
    let mut from = File::open(src)?;
    let mut to = create_file(dir, name)?;
    std::io::copy(&mut from, &mut to).map(drop)
}

/// `verifier/`, made afresh.
#[derive(Debug)]
pub struct Remade {
    /// The new, empty dir (owned by the caller: root inside the sandbox).
    pub dir: OwnedFd,
    /// What was found there, for the result's notes.
    pub notes: Vec<String>,
}

/// Moves `sub` of the rollout dir `dir` (whatever is there: a dir, a
/// file, a symlink, unfollowed) into `to` under the same name, and makes
/// a fresh, empty `sub` (0755, the caller's), opened `O_NOFOLLOW`. For a
/// multi-step rollout's step outputs; `to` is out of the sandbox's sight.
pub fn move_out_and_remake(
    dir: BorrowedFd<'_>,
    sub: &str,
    to: BorrowedFd<'_>,
) -> Result<OwnedFd, String> {
    match rustix::fs::renameat_with(dir, sub, to, sub, RenameFlags::NOREPLACE) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(format!("moving {sub}/ out of the rollout dir: {e}")),
    }
    rustix::fs::mkdirat(dir, sub, Mode::from_raw_mode(0o755))
        .map_err(|e| format!("re-making {sub}/ in the rollout dir: {e}"))?;
    beneath::open_dir(dir, sub).map_err(|e| format!("opening {sub}/ in the rollout dir: {e}"))
}

/// Moves every entry of the dir `from` (unfollowed) into a fresh dir
/// `sub` of `to`, leaving `from` itself in place, empty: a multi-step
/// rollout's `verifier/`, which its binds show where it is (see
/// `spec::GuardedBind`). The entries must be the caller's (a dir moved to
/// another parent needs write access to itself).
pub fn move_entries(from: BorrowedFd<'_>, sub: &str, to: BorrowedFd<'_>) -> Result<(), String> {
    let dest = make_subdir(to, sub).map_err(|e| format!("making {sub}/ of the step: {e}"))?;
    let listing = rustix::io::fcntl_dupfd_cloexec(from, 0)
        .and_then(rustix::fs::Dir::read_from)
        .map_err(|e| format!("listing {sub}/: {e}"))?;
    let mut names = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|e| format!("listing {sub}/: {e}"))?;
        let name = entry.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    for name in names {
        rustix::fs::renameat_with(from, &name, dest.as_fd(), &name, RenameFlags::NOREPLACE)
            .map_err(|e| format!("moving {sub}/{} out: {e}", name.to_string_lossy()))?;
    }
    Ok(())
}

/// Makes the dir `name` in `dir` (which must not have it) and opens it.
pub fn make_subdir(dir: BorrowedFd<'_>, name: &str) -> std::io::Result<OwnedFd> {
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755))?;
    Ok(beneath::open_dir(dir, name)?)
}

/// Re-makes `verifier/` in the rollout dir `dir` before the verifier runs.
/// Whatever is there (a dir with planted files, a reward file, a symlink, a
/// file) is renamed aside and removed without following any symlink, and
/// a new dir is made and opened (`O_NOFOLLOW`). What the host cannot
/// remove (files of the sandbox's other ids) goes through `remove_inside`,
/// which is given the aside name's path inside the sandbox (`/logs/NAME`);
/// what even that leaves stays aside, with a note. A sandbox that keeps
/// replacing `verifier/` while this runs makes it fail after a few tries.
pub fn remake_verifier(
    dir: BorrowedFd<'_>,
    remove_inside: &dyn Fn(&str) -> Result<(), String>,
) -> Result<Remade, String> {
    let mut notes = Vec::new();
    let mut note = |n: String| {
        if !notes.contains(&n) {
            notes.push(n);
        }
    };
    for _ in 0..REMAKE_TRIES {
        match rustix::fs::statat(dir, "verifier", AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => {}
            Err(e) => return Err(format!("verifier/ in the rollout dir: {e}")),
            Ok(st) => {
                let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
                if kind.is_dir() {
                    if let Ok(old) = beneath::open_dir(dir, "verifier") {
                        if crate::reward::present(old.as_fd()) {
                            note("a reward file was there before the verifier ran (left by the agent?); it was removed".into());
                        }
                    }
                } else {
                    note(format!(
                        "verifier/ was {} before the verifier ran (left by the agent?); it was replaced by a directory",
                        kind_name(kind)
                    ));
                }
                let aside = format!(".verifier.left-{}", sifbox_engine::random_id(8));
                match rustix::fs::renameat_with(
                    dir,
                    "verifier",
                    dir,
                    &aside,
                    RenameFlags::NOREPLACE,
                ) {
                    Ok(()) => {
                        if let Err(e) = remove_aside(dir, &aside, remove_inside) {
                            note(format!(
                                "what was at verifier/ before the verifier ran is in {aside}: it could not be removed ({e})"
                            ));
                        }
                    }
                    // Gone or replaced meanwhile: look again.
                    Err(Errno::NOENT | Errno::EXIST) => continue,
                    Err(e) => {
                        return Err(format!("moving verifier/ aside in the rollout dir: {e}"))
                    }
                }
            }
        }
        match rustix::fs::mkdirat(dir, "verifier", Mode::from_raw_mode(0o755)) {
            Ok(()) => {}
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(format!("creating verifier/ in the rollout dir: {e}")),
        }
        match beneath::open_dir(dir, "verifier") {
            Ok(fd) => return Ok(Remade { dir: fd, notes }),
            Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => {}
            Err(e) => return Err(format!("opening verifier/ in the rollout dir: {e}")),
        }
    }
    Err(format!(
        "verifier/ in the rollout dir was replaced {REMAKE_TRIES} times while sifbox re-made it for the verifier (by a process the agent left running?)"
    ))
}

fn kind_name(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match kind {
        FileType::Symlink => "a symlink",
        FileType::RegularFile => "a file",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        _ => "not a directory",
    }
}

/// Removes the entry `name` of `dir` (a tree, a file, a symlink: never
/// followed); by the sandbox when the host may not.
fn remove_aside(
    dir: BorrowedFd<'_>,
    name: &str,
    remove_inside: &dyn Fn(&str) -> Result<(), String>,
) -> Result<(), String> {
    let on_host = match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR | Errno::PERM) => {
            // A directory (Linux says EISDIR, POSIX EPERM). cap-std's
            // removal opens every level with O_NOFOLLOW.
            let d = rustix::io::fcntl_dupfd_cloexec(dir, 0).map_err(|e| e.to_string())?;
            cap_std::fs::Dir::from_std_file(File::from(d)).remove_dir_all(name)
        }
        Err(e) => Err(e.into()),
    };
    match on_host {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(host) => remove_inside(&format!("/logs/{name}"))
            .map_err(|inside| format!("on the host: {host}; in the sandbox: {inside}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn no_inside(_: &str) -> Result<(), String> {
        Err("no sandbox".into())
    }

    /// Names and mtimes of everything below `dir`.
    fn listing(dir: &Path) -> Vec<(String, std::time::SystemTime)> {
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .expect("ls")
            .map(|e| {
                let e = e.expect("entry");
                let m = std::fs::symlink_metadata(e.path()).expect("stat");
                (
                    e.file_name().to_string_lossy().into_owned(),
                    m.modified().expect("mtime"),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn create_file_never_writes_through_a_symlink() {
        let d = tempfile::tempdir().expect("tempdir");
        let decoy = d.path().join("decoy");
        std::fs::write(&decoy, "keep").expect("write");
        let rollout = d.path().join("r");
        std::fs::create_dir(&rollout).expect("mkdir");
        std::os::unix::fs::symlink(&decoy, rollout.join("out.txt")).expect("symlink");
        let fd = open_dir_nofollow(&rollout).expect("open");
        let mut f = create_file(fd.as_fd(), "out.txt").expect("create");
        f.write_all(b"mine").expect("write");
        assert_eq!(std::fs::read_to_string(&decoy).expect("read"), "keep");
        assert_eq!(
            std::fs::read_to_string(rollout.join("out.txt")).expect("read"),
            "mine"
        );
        // The dir itself a symlink: not opened.
        std::os::unix::fs::symlink(&rollout, d.path().join("link")).expect("symlink");
        assert!(open_dir_nofollow(&d.path().join("link")).is_err());
    }

    #[test]
    fn json_replaces_a_planted_symlink_and_reads_by_fd() {
        let d = tempfile::tempdir().expect("tempdir");
        let decoy = d.path().join("decoy.json");
        std::fs::write(&decoy, "{}").expect("write");
        let rollout = d.path().join("r");
        std::fs::create_dir(&rollout).expect("mkdir");
        std::os::unix::fs::symlink(&decoy, rollout.join("result.json")).expect("symlink");
        let fd = open_dir_nofollow(&rollout).expect("open");
        assert_eq!(
            read_small(fd.as_fd(), "result.json", 100),
            None,
            "a symlink is not read"
        );
        write_json_at(fd.as_fd(), "result.json", &serde_json::json!({"a": 1})).expect("write");
        assert_eq!(std::fs::read_to_string(&decoy).expect("read"), "{}");
        let got = read_small(fd.as_fd(), "result.json", 100).expect("read");
        assert!(String::from_utf8_lossy(&got).contains("\"a\": 1"));
        let mode = std::fs::metadata(rollout.join("result.json"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        assert_eq!(
            read_small(fd.as_fd(), "result.json", 3),
            None,
            "over the limit"
        );
        let names: Vec<_> = listing(&rollout).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["result.json"], "no temp file left");
    }

    #[test]
    fn remake_replaces_a_symlink_without_touching_its_target() {
        let d = tempfile::tempdir().expect("tempdir");
        let decoy = d.path().join("decoy");
        std::fs::create_dir(&decoy).expect("mkdir");
        std::fs::write(decoy.join("reward.txt"), "1").expect("write");
        std::fs::write(decoy.join("test-stdout.txt"), "old").expect("write");
        let before = listing(&decoy);
        let rollout = d.path().join("r");
        std::fs::create_dir(&rollout).expect("mkdir");
        std::os::unix::fs::symlink(&decoy, rollout.join("verifier")).expect("symlink");
        let fd = open_dir_nofollow(&rollout).expect("open");
        let remade = remake_verifier(fd.as_fd(), &no_inside).expect("remake");
        assert_eq!(remade.notes.len(), 1, "{:?}", remade.notes);
        assert!(remade.notes[0].contains("a symlink"), "{:?}", remade.notes);
        let mut f = create_file(remade.dir.as_fd(), "test-stdout.txt").expect("create");
        f.write_all(b"new").expect("write");
        assert_eq!(listing(&decoy), before, "the decoy changed");
        assert_eq!(
            std::fs::read_to_string(decoy.join("test-stdout.txt")).expect("read"),
            "old"
        );
        assert!(std::fs::symlink_metadata(rollout.join("verifier"))
            .expect("stat")
            .is_dir());
        assert_eq!(
            std::fs::read_to_string(rollout.join("verifier/test-stdout.txt")).expect("read"),
            "new"
        );
        let names: Vec<_> = listing(&rollout).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["verifier"], "the symlink was removed");
    }

    #[test]
    fn remake_empties_a_planted_dir_and_notes_a_reward() {
        let d = tempfile::tempdir().expect("tempdir");
        let rollout = d.path().join("r");
        std::fs::create_dir_all(rollout.join("verifier/deep/er")).expect("mkdir");
        std::fs::write(rollout.join("verifier/reward.txt"), "1").expect("write");
        std::fs::write(rollout.join("verifier/deep/er/x"), "x").expect("write");
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), "k").expect("write");
        std::os::unix::fs::symlink(&outside, rollout.join("verifier/deep/link")).expect("symlink");
        let fd = open_dir_nofollow(&rollout).expect("open");
        let remade = remake_verifier(fd.as_fd(), &no_inside).expect("remake");
        assert_eq!(
            remade.notes,
            ["a reward file was there before the verifier ran (left by the agent?); it was removed"]
        );
        assert_eq!(
            std::fs::read_dir(rollout.join("verifier"))
                .expect("ls")
                .count(),
            0
        );
        assert!(
            outside.join("keep").is_file(),
            "a symlink inside was followed"
        );
        let names: Vec<_> = listing(&rollout).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["verifier"]);
        // Nothing there at all: a fresh dir, no note.
        std::fs::remove_dir(rollout.join("verifier")).expect("rmdir");
        let remade = remake_verifier(fd.as_fd(), &no_inside).expect("remake");
        assert!(remade.notes.is_empty(), "{:?}", remade.notes);
    }

    #[test]
    fn remake_leaves_aside_what_nobody_can_remove() {
        // A dir the host may not empty: as root, every removal works, so
        // this runs only unprivileged.
        if rustix::process::geteuid().is_root() {
            return;
        }
        let d = tempfile::tempdir().expect("tempdir");
        let rollout = d.path().join("r");
        std::fs::create_dir_all(rollout.join("verifier/locked")).expect("mkdir");
        std::fs::write(rollout.join("verifier/locked/f"), "f").expect("write");
        std::fs::set_permissions(
            rollout.join("verifier/locked"),
            std::fs::Permissions::from_mode(0o555),
        )
        .expect("chmod");
        let fd = open_dir_nofollow(&rollout).expect("open");
        let asked = std::cell::RefCell::new(Vec::new());
        let inside = |p: &str| -> Result<(), String> {
            asked.borrow_mut().push(p.to_string());
            Err("refused".into())
        };
        let remade = remake_verifier(fd.as_fd(), &inside).expect("remake");
        let asked = asked.into_inner();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert!(asked[0].starts_with("/logs/.verifier.left-"), "{asked:?}");
        assert!(
            remade
                .notes
                .iter()
                .any(|n| n.contains("could not be removed")),
            "{:?}",
            remade.notes
        );
        assert_eq!(
            std::fs::read_dir(rollout.join("verifier"))
                .expect("ls")
                .count(),
            0
        );
        for e in std::fs::read_dir(&rollout).expect("ls") {
            let p = e.expect("entry").path().join("locked");
            if p.exists() {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod");
            }
        }
    }

    #[test]
    fn move_entries_empties_the_dir_in_place_and_follows_no_symlink() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().expect("tempdir");
        let verifier = d.path().join("verifier");
        let archive = d.path().join("archive");
        let decoy = d.path().join("decoy");
        for dir in [&verifier, &archive, &decoy] {
            std::fs::create_dir(dir).expect("mkdir");
        }
        std::fs::write(verifier.join("reward.txt"), "1\n").expect("write");
        std::fs::create_dir(verifier.join("sub")).expect("mkdir");
        std::fs::write(verifier.join("sub/f"), "f").expect("write");
        std::os::unix::fs::symlink(&decoy, verifier.join("link")).expect("symlink");
        let held = open_dir_nofollow(&verifier).expect("open");
        let ino = std::fs::metadata(&verifier).expect("stat").ino();
        let to = open_dir_nofollow(&archive).expect("open");
        move_entries(held.as_fd(), "verifier", to.as_fd()).expect("move");
        // The same dir, empty; all of it in archive/verifier/.
        assert_eq!(std::fs::metadata(&verifier).expect("stat").ino(), ino);
        assert_eq!(std::fs::read_dir(&verifier).expect("ls").count(), 0);
        let moved = archive.join("verifier");
        assert_eq!(
            std::fs::read_to_string(moved.join("reward.txt")).expect("read"),
            "1\n"
        );
        assert_eq!(
            std::fs::read_to_string(moved.join("sub/f")).expect("read"),
            "f"
        );
        assert!(std::fs::symlink_metadata(moved.join("link"))
            .expect("link")
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_dir(&decoy).expect("ls").count(), 0);
        // A second step's archive: the dir name taken is an error, not a merge.
        assert!(move_entries(held.as_fd(), "verifier", to.as_fd()).is_err());
    }
}
