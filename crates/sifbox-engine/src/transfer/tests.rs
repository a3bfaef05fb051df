//! Tests of `transfer`: archives and unpackings against hostile trees and
//! streams, give-back, and properties of the tar round trip.

use super::*;
use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid, CWD};

/// give_back and anything_not_owned_by on a tree of another id with a
/// symlink out, a FIFO and a deep chain: the link is changed, never
/// its target; the FIFO is not opened; nothing is left of the other
/// id, 300 levels down included. (Root only: chown needs it.)
#[test]
fn give_back_changes_the_tree_and_follows_nothing() {
    use std::os::unix::fs::{symlink, MetadataExt};
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let t = tempfile::tempdir().expect("tmp");
    let (top, outside) = (t.path().join("top"), t.path().join("outside"));
    std::fs::create_dir_all(top.join("d/e")).expect("mkdir");
    std::fs::write(top.join("d/e/f"), "x").expect("write");
    std::fs::write(&outside, "o").expect("write");
    symlink(&outside, top.join("d/link")).expect("symlink");
    rustix::fs::mknodat(
        CWD,
        top.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
    assert!(!anything_not_owned_by(&top, 0, &[0]));
    // A chain of 300 levels, made by fds (its path is longer than
    // PATH_MAX): no depth is out of reach.
    std::fs::create_dir(top.join("deep")).expect("mkdir");
    let mut fd = rustix::fs::open(
        top.join("deep"),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .expect("open");
    let long = "x".repeat(100);
    for _ in 0..300 {
        rustix::fs::mkdirat(&fd, long.as_str(), Mode::from_raw_mode(0o755)).expect("mkdir");
        fd = rustix::fs::openat(
            &fd,
            long.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .expect("open");
    }
    let deepest_owner = |fd: &OwnedFd| rustix::fs::fstat(fd).expect("stat").st_uid;
    rustix::fs::fchown(&fd, Some(Uid::from_raw(4321)), Some(Gid::from_raw(4321))).expect("chown");
    let own = |p: &Path, id: u32| {
        rustix::fs::chownat(
            CWD,
            p,
            Some(Uid::from_raw(id)),
            Some(Gid::from_raw(id)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("chown");
    };
    for p in ["d", "d/e", "d/e/f", "d/link", "fifo"] {
        own(&top.join(p), 4321);
    }
    own(&outside, 4321);
    // A group that is not mapped (seen as the overflow gid) stays.
    std::fs::write(top.join("grouped"), "g").expect("write");
    rustix::fs::chownat(
        CWD,
        top.join("grouped"),
        Some(Uid::from_raw(4321)),
        Some(Gid::from_raw(65534)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("chown");
    assert!(anything_not_owned_by(&top, 0, &[0]));
    give_back(&top).expect("give back");
    assert_eq!(deepest_owner(&fd), 0, "the 300th level is given back");
    for p in ["d", "d/e", "d/e/f", "d/link", "fifo"] {
        let md = std::fs::symlink_metadata(top.join(p)).expect("stat");
        assert_eq!((md.uid(), md.gid()), (0, 0), "{p}");
    }
    let grouped = std::fs::metadata(top.join("grouped")).expect("stat");
    assert_eq!((grouped.uid(), grouped.gid()), (0, 65534));
    assert_eq!(std::fs::metadata(&outside).expect("stat").uid(), 4321);
    // The deepest level is seen too.
    rustix::fs::fchown(&fd, Some(Uid::from_raw(4321)), None).expect("chown");
    assert!(anything_not_owned_by(&top, 0, &[0, 65534]));
    rustix::fs::fchown(&fd, Some(Uid::from_raw(0)), None).expect("chown");
    drop(fd);
    std::fs::remove_dir_all(top.join("deep")).expect("rm");
    // The overflow group is none of the caller's here (root's: 0).
    assert!(anything_not_owned_by(&top, 0, &[0]));
    assert!(!anything_not_owned_by(&top, 0, &[0, 65534]));
    // Nothing there is nothing to give back.
    assert!(!anything_not_owned_by(&top.join("gone"), 0, &[0]));
}
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
fn marking_adds_execute_bits_to_that_one_regular_file() {
    let t = tempfile::tempdir().expect("tempdir");
    let s = t.path().join("solution");
    std::fs::create_dir_all(&s).expect("mkdir");
    for f in ["solve.sh", "helper.sh"] {
        std::fs::write(s.join(f), b"#!/bin/sh\n").expect("write");
        std::fs::set_permissions(s.join(f), std::fs::Permissions::from_mode(0o640)).expect("chmod");
    }
    let mode_of = |marked: Option<&Path>| {
        let mut buf = Vec::new();
        write_tar_marking(&s, "solution", marked, &mut buf).expect("tar");
        let mut a = tar::Archive::new(&buf[..]);
        let mut modes = Vec::new();
        for e in a.entries().expect("entries") {
            let e = e.expect("entry");
            let path = e.path().expect("path").display().to_string();
            modes.push((path, e.header().mode().expect("mode") & 0o7777));
        }
        modes
    };
    let plain = mode_of(None);
    let marked = mode_of(Some(Path::new("solution/solve.sh")));
    assert!(
        plain.contains(&("solution/solve.sh".into(), 0o640)),
        "{plain:?}"
    );
    assert!(
        marked.contains(&("solution/solve.sh".into(), 0o751)),
        "{marked:?}"
    );
    assert!(
        marked.contains(&("solution/helper.sh".into(), 0o640)),
        "{marked:?}"
    );
    // A directory named so is left as it is.
    let dir = mode_of(Some(Path::new("solution")));
    assert_eq!(dir, plain);
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

// -- Crafted streams: what a hostile sandbox can send to the host. --

/// One entry of a crafted stream.
enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, u32, &'a [u8]),
    Sym(&'a str, &'a Path),
    Hard(&'a str, &'a Path),
}

fn stream(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_600_000_000);
        match e {
            E::Dir(name, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                h.set_size(0);
                b.append_data(&mut h, name, std::io::empty()).expect("dir");
            }
            E::File(name, mode, data) => {
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, name, *data).expect("file");
            }
            E::Sym(name, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, name, target).expect("symlink");
            }
            E::Hard(name, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                b.append_link(&mut h, name, target).expect("hard link");
            }
        }
    }
    b.into_inner().expect("tar")
}

/// A temp dir with `dest/` (where streams land) and, outside it,
/// `decoy/file` (mode 0644) that no stream may touch.
struct Scene {
    t: tempfile::TempDir,
}

const DECOY: &[u8] = b"decoy, never to be changed";

impl Scene {
    fn new() -> Scene {
        let t = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(t.path().join("dest")).expect("mkdir");
        std::fs::create_dir(t.path().join("decoy")).expect("mkdir");
        std::fs::write(t.path().join("decoy/file"), DECOY).expect("write");
        std::fs::set_permissions(
            t.path().join("decoy/file"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        Scene { t }
    }
    fn dest(&self) -> PathBuf {
        self.t.path().join("dest")
    }
    fn decoy_dir(&self) -> PathBuf {
        self.t.path().join("decoy")
    }
    fn decoy(&self) -> PathBuf {
        self.t.path().join("decoy/file")
    }
    /// Unpacks as a download to the host does.
    fn download(&self, data: &[u8]) -> std::io::Result<()> {
        unpack_to_host(data, &self.dest(), "x", SetId::Strip)
    }
    /// The decoy is as it was: content, mode, one link, alone in its dir.
    #[track_caller]
    fn assert_decoy_intact(&self) {
        let md = std::fs::symlink_metadata(self.decoy()).expect("decoy");
        assert_eq!(md.mode() & 0o7777, 0o644, "decoy mode changed");
        assert_eq!(md.nlink(), 1, "decoy got a hard link");
        assert_eq!(std::fs::read(self.decoy()).expect("read"), DECOY);
        let names: Vec<_> = std::fs::read_dir(self.decoy_dir())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("file")], "decoy dir changed");
    }
}

#[track_caller]
fn assert_refused(r: std::io::Result<()>, entry: &str) {
    let e = r.expect_err("the stream was unpacked");
    assert!(
        e.to_string().contains(&format!("archive entry {entry}")),
        "the error does not name {entry}: {e}"
    );
}

#[test]
fn dir_then_symlink_of_the_same_name_is_refused() {
    let s = Scene::new();
    let decoy_dir = s.decoy_dir();
    let data = stream(&[
        E::Dir("x", 0o755),
        E::Dir("x/d", 0o755),
        E::Sym("x/d", &decoy_dir),
        E::File("x/d/pwned", 0o644, b"evil"),
    ]);
    assert_refused(s.download(&data), "x/d");
    s.assert_decoy_intact();
    // A refused stream leaves nothing of what it made.
    assert!(!s.dest().join("x").exists());
}

#[test]
fn symlink_then_dir_of_the_same_name_is_refused() {
    let s = Scene::new();
    // The link leads back inside, so that a walk that follows it would
    // not notice: the entry must be refused for its changed type.
    let data = stream(&[
        E::Dir("x", 0o755),
        E::Sym("x/d", Path::new(".")),
        E::Dir("x/d", 0o755),
        E::File("x/d/f", 0o644, b"through"),
    ]);
    assert_refused(s.download(&data), "x/d");
    assert!(!s.dest().join("x/f").exists(), "written through x/d");
    s.assert_decoy_intact();
}

#[test]
fn files_never_go_through_a_symlink_to_a_decoy() {
    let s = Scene::new();
    let (decoy_dir, decoy) = (s.decoy_dir(), s.decoy());
    // A file below a symlink to the decoy's directory.
    let data = stream(&[
        E::Dir("x", 0o755),
        E::Sym("x/esc", &decoy_dir),
        E::File("x/esc/pwned", 0o644, b"evil"),
    ]);
    assert_refused(s.download(&data), "x/esc/pwned");
    s.assert_decoy_intact();
    // A file of the same name as a symlink to the decoy.
    let data = stream(&[
        E::Dir("x", 0o755),
        E::Sym("x/l", &decoy),
        E::File("x/l", 0o4755, b"evil"),
    ]);
    assert_refused(s.download(&data), "x/l");
    s.assert_decoy_intact();
    // One already in the destination is not followed either.
    let s = Scene::new();
    std::fs::create_dir(s.dest().join("x")).expect("mkdir");
    std::os::unix::fs::symlink(s.decoy(), s.dest().join("x/l")).expect("symlink");
    std::os::unix::fs::symlink(s.decoy_dir(), s.dest().join("x/esc")).expect("symlink");
    let data = stream(&[E::File("x/l", 0o4755, b"evil")]);
    s.download(&data).expect("a file replaces the symlink");
    assert_eq!(std::fs::read(s.dest().join("x/l")).expect("read"), b"evil");
    let data = stream(&[E::File("x/esc/pwned", 0o644, b"evil")]);
    assert_refused(s.download(&data), "x/esc/pwned");
    let data = stream(&[E::Dir("x/esc", 0o4755)]);
    assert_refused(s.download(&data), "x/esc");
    s.assert_decoy_intact();
}

/// A directory's mode is applied at the end; by then its name may be a
/// symlink (here through a second one, made harmless-looking when the
/// directory entry came): the mode must never reach the decoy.
#[test]
fn dir_modes_never_reach_through_a_symlink() {
    let s = Scene::new();
    let decoy = s.decoy();
    let data = stream(&[
        E::Dir("x", 0o755),
        E::Sym("x/e", Path::new(".")),
        E::Sym("x/d", Path::new("e")),
        E::Dir("x/d", 0o4755),
        E::Sym("x/e", &decoy),
    ]);
    let r = s.download(&data);
    s.assert_decoy_intact();
    assert_refused(r, "x/d");
}

#[test]
fn hard_links_only_to_regular_files_written_before() {
    let s = Scene::new();
    let outside = format!("{}/../decoy/file", s.dest().display());
    std::fs::create_dir(s.dest().join("x")).expect("mkdir");
    std::fs::write(s.dest().join("x/pre"), "already there").expect("write");
    let decoy = s.decoy();
    let cases: Vec<(&str, Vec<E<'_>>)> = vec![
        (
            "climbs out",
            vec![E::Hard("x/h", Path::new("x/../../decoy/file"))],
        ),
        ("absolute", vec![E::Hard("x/h", &decoy)]),
        (
            "absolute with ..",
            vec![E::Hard("x/h", Path::new(&outside))],
        ),
        (
            "to a later entry",
            vec![
                E::Hard("x/h", Path::new("x/later")),
                E::File("x/later", 0o644, b"later"),
            ],
        ),
        (
            "to a file not from this stream",
            vec![E::Hard("x/h", Path::new("x/pre"))],
        ),
        (
            "to a symlink of this stream",
            vec![E::Sym("x/s", &decoy), E::Hard("x/h", Path::new("x/s"))],
        ),
        (
            "to a directory of this stream",
            vec![E::Dir("x/sub", 0o755), E::Hard("x/h", Path::new("x/sub"))],
        ),
    ];
    for (what, entries) in cases {
        let r = s.download(&stream(&entries));
        assert!(r.is_err(), "{what}: unpacked");
        assert_refused(r, "x/h");
        assert!(
            std::fs::symlink_metadata(s.dest().join("x/h")).is_err(),
            "{what}: x/h made"
        );
        s.assert_decoy_intact();
    }
    assert_eq!(
        std::fs::metadata(s.dest().join("x/pre"))
            .expect("pre")
            .nlink(),
        1
    );
    // To a file written before: one inode.
    let data = stream(&[
        E::File("x/f", 0o640, b"shared"),
        E::Hard("x/h", Path::new("x/f")),
    ]);
    s.download(&data)
        .expect("a hard link to a file of the stream");
    let (f, h) = (
        std::fs::metadata(s.dest().join("x/f")).expect("f"),
        std::fs::metadata(s.dest().join("x/h")).expect("h"),
    );
    assert_eq!((f.ino(), f.nlink()), (h.ino(), 2));
}

#[test]
fn setid_bits_are_dropped_on_the_host_unless_kept() {
    let data = stream(&[
        E::Dir("x", 0o2755),
        E::File("x/suid", 0o4755, b"#!/bin/sh\n"),
        E::File("x/sgid", 0o2711, b"#!/bin/sh\n"),
        E::File("x/sticky", 0o1777, b""),
    ]);
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;
    for (setid, want) in [
        (SetId::Strip, [0o755, 0o755, 0o711, 0o1777]),
        (SetId::Keep, [0o2755, 0o4755, 0o2711, 0o1777]),
    ] {
        let out = tempfile::tempdir().expect("tempdir");
        unpack_to_host(&data[..], out.path(), "x", setid).expect("unpack");
        let d = out.path().join("x");
        let got = [
            mode(&d),
            mode(&d.join("suid")),
            mode(&d.join("sgid")),
            mode(&d.join("sticky")),
        ];
        assert_eq!(got, want, "{setid:?}");
    }
    // The sandbox side of an upload keeps them, also for another owner.
    let out = tempfile::tempdir().expect("tempdir");
    let me = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    unpack_tar(&data[..], out.path(), "x", Some(me)).expect("unpack");
    assert_eq!(mode(&out.path().join("x/suid")), 0o4755);
}

/// A name below the source that is swapped for a symlink to a decoy (a
/// file, and a directory) while the tree is archived, again and again:
/// the decoy's content never gets into an archive.
#[test]
fn write_tar_never_follows_a_name_swapped_for_a_symlink() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const MARKER: &[u8] = b"decoy-marker-8c1f2e";
    let t = tempfile::tempdir().expect("tempdir");
    let (src, decoy) = (t.path().join("src"), t.path().join("decoy"));
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    std::fs::create_dir(&decoy).expect("mkdir");
    std::fs::write(decoy.join("f"), MARKER).expect("write");
    std::fs::write(src.join("f"), "benign").expect("write");
    std::fs::write(src.join("d/f"), "benign").expect("write");
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flips = std::sync::Arc::new(AtomicU64::new(0));
    let flipper = {
        let (src, decoy) = (src.clone(), decoy.clone());
        let (stop, flips) = (stop.clone(), flips.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::os::unix::fs::symlink(decoy.join("f"), src.join("l"));
                let _ = std::fs::rename(src.join("l"), src.join("f"));
                let _ = std::fs::write(src.join("t"), "benign");
                let _ = std::fs::rename(src.join("t"), src.join("f"));
                let _ = std::fs::rename(src.join("d"), src.join("d.real"));
                let _ = std::os::unix::fs::symlink(&decoy, src.join("d"));
                let _ = std::fs::remove_file(src.join("d"));
                let _ = std::fs::rename(src.join("d.real"), src.join("d"));
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Until the flipper has swapped the names many times (bounded).
    let (mut archives, mut links, mut files) = (0, 0, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while (archives < 300 || flips.load(Ordering::Relaxed) < 1000)
        && std::time::Instant::now() < deadline
    {
        let mut buf = Vec::new();
        write_tar(&src, "src", &mut buf).expect("tar");
        archives += 1;
        let mut ar = tar::Archive::new(&buf[..]);
        for e in ar.entries().expect("entries") {
            let mut e = e.expect("entry");
            let path = e.path().expect("path").into_owned();
            if path == Path::new("src/f") {
                if e.header().entry_type().is_symlink() {
                    links += 1;
                } else {
                    files += 1;
                }
            }
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("read");
            assert!(
                !data.windows(MARKER.len()).any(|w| w == MARKER),
                "{} carries the decoy's content",
                path.display()
            );
        }
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().expect("flipper");
    let flips = flips.load(Ordering::Relaxed);
    eprintln!("{archives} archives, {flips} flips; src/f a symlink {links}, a file {files}");
    assert!(links > 0 && files > 0, "the race never happened");
}

// -- retar: a sandbox's stream passed on to stdout (`cp NAME:/path -`). --

/// The names, types and modes of a tar stream's entries.
fn entries_of(data: &[u8]) -> Vec<(String, char, u32)> {
    let mut ar = tar::Archive::new(data);
    ar.entries()
        .expect("entries")
        .map(|e| {
            let e = e.expect("entry");
            let h = e.header();
            let kind = match h.entry_type() {
                tar::EntryType::Directory => 'd',
                tar::EntryType::Symlink => 'l',
                tar::EntryType::Link => 'h',
                _ => 'f',
            };
            let name = e.path().expect("path").display().to_string();
            (name, kind, h.mode().expect("mode") & 0o7777)
        })
        .collect()
}

fn retarred(data: &[u8], setid: SetId) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    retar(data, "x", setid, &mut out)?;
    Ok(out)
}

#[test]
fn retar_passes_on_a_plain_tree_and_drops_setid_unless_kept() {
    let data = stream(&[
        E::Dir("x", 0o2755),
        E::File("x/suid", 0o4755, b"#!/bin/sh\n"),
        E::Dir("x/sub", 0o710),
        E::File("x/sub/f", 0o604, b"data"),
        E::Sym("x/l", Path::new("/etc/shadow")),
        E::Hard("x/h", Path::new("x/sub/f")),
    ]);
    let plain = |m: u32| m & !0o6000;
    let got = entries_of(&retarred(&data, SetId::Strip).expect("retar"));
    assert_eq!(
        got,
        vec![
            ("x".into(), 'd', plain(0o2755)),
            ("x/suid".into(), 'f', plain(0o4755)),
            ("x/sub".into(), 'd', 0o710),
            ("x/sub/f".into(), 'f', 0o604),
            ("x/l".into(), 'l', 0o777),
            ("x/h".into(), 'h', 0o644),
        ]
    );
    let kept = entries_of(&retarred(&data, SetId::Keep).expect("retar"));
    assert_eq!(kept[0].2, 0o2755);
    assert_eq!(kept[1].2, 0o4755);
    // Data, link targets and times come through; it unpacks as sent.
    let out = tempfile::tempdir().expect("tempdir");
    let copy = retarred(&data, SetId::Keep).expect("retar");
    unpack_to_host(&copy[..], out.path(), "x", SetId::Keep).expect("unpack");
    let x = out.path().join("x");
    assert_eq!(std::fs::read(x.join("sub/f")).expect("read"), b"data");
    assert_eq!(std::fs::read(x.join("h")).expect("read"), b"data");
    assert_eq!(
        std::fs::read_link(x.join("l")).expect("readlink"),
        Path::new("/etc/shadow")
    );
    let md = std::fs::metadata(x.join("suid")).expect("stat");
    assert_eq!((md.mode() & 0o7777, md.mtime()), (0o4755, 1_600_000_000));
}

#[test]
fn retar_refuses_what_a_download_refuses() {
    let cases: Vec<(&str, Vec<E<'_>>, &str)> = vec![
        ("another top name", vec![E::File("y/f", 0o644, b"")], "y/f"),
        (
            "below a symlink it sent",
            vec![
                E::Dir("x", 0o755),
                E::Sym("x/esc", Path::new("/")),
                E::File("x/esc/etc/passwd", 0o644, b"evil"),
            ],
            "x/esc/etc/passwd",
        ),
        (
            "below a file it sent",
            vec![E::File("x/f", 0o644, b""), E::File("x/f/g", 0o644, b"")],
            "x/f/g",
        ),
        (
            "a dir, then a symlink of its name",
            vec![E::Dir("x/d", 0o755), E::Sym("x/d", Path::new("/etc"))],
            "x/d",
        ),
        (
            "a hard link out",
            vec![E::Hard("x/h", Path::new("x/../../etc/passwd"))],
            "x/h",
        ),
        (
            "a hard link to a file not sent",
            vec![E::Hard("x/h", Path::new("x/later"))],
            "x/h",
        ),
        (
            "a hard link to a symlink",
            vec![
                E::Sym("x/s", Path::new("/etc/passwd")),
                E::Hard("x/h", Path::new("x/s")),
            ],
            "x/h",
        ),
    ];
    for (what, entries, entry) in cases {
        let r = retarred(&stream(&entries), SetId::Keep).map(drop);
        assert!(r.is_err(), "{what}: passed on");
        assert_refused(r, entry);
    }
    // Names the tar crate will not write: `..` and absolute ones.
    for bad in ["x/../../etc/passwd", "/etc/passwd", "../x"] {
        let mut raw = vec![0u8; 1024 + 512];
        let mut h = tar::Header::new_old();
        h.set_size(0);
        h.set_mode(0o644);
        h.as_old_mut().name[..bad.len()].copy_from_slice(bad.as_bytes());
        h.set_cksum();
        raw[..512].copy_from_slice(h.as_bytes());
        assert_refused(retarred(&raw, SetId::Keep).map(drop), bad);
    }
}

/// A tree with a 64 MiB file holding 8 KiB of data, archived.
fn sparse_tree() -> (tempfile::TempDir, Vec<u8>) {
    use std::os::unix::fs::FileExt;
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let f = File::create(src.join("sparse")).expect("create");
    f.write_all_at(&[1u8; 4096], 0).expect("write");
    f.write_all_at(&[2u8; 4096], 40 << 20).expect("write");
    f.set_len(64 << 20).expect("truncate");
    std::fs::write(src.join("plain"), "plain").expect("write");
    let mut data = Vec::new();
    write_tar(&src, "src", &mut data).expect("tar");
    (t, data)
}

#[test]
fn sparse_files_keep_their_holes_through_download_and_retar() {
    let (t, data) = sparse_tree();
    if data.len() > 1 << 20 {
        eprintln!("skipped: the temp dir's file system reports no holes");
        return;
    }
    let mut again = Vec::new();
    retar(&data[..], "src", SetId::Strip, &mut again).expect("retar");
    assert!(again.len() < 1 << 20, "retar sent {} bytes", again.len());
    for (i, stream) in [&data, &again].into_iter().enumerate() {
        let out = t.path().join(format!("out{i}"));
        std::fs::create_dir(&out).expect("mkdir");
        unpack_to_host(&stream[..], &out, "src", SetId::Strip).expect("unpack");
        let got = out.join("src/sparse");
        let md = std::fs::metadata(&got).expect("stat");
        assert_eq!(md.len(), 64 << 20);
        assert!(md.blocks() < 1024, "{} blocks", md.blocks());
        assert_eq!(
            std::fs::read(&got).expect("read"),
            std::fs::read(t.path().join("src/sparse")).expect("read")
        );
    }
}

#[test]
fn a_download_past_its_limits_fails_and_leaves_nothing() {
    let (t, data) = sparse_tree();
    for limits in [
        Limits {
            max_bytes: 4096,
            max_entries: 100,
        },
        Limits {
            max_bytes: 1 << 30,
            max_entries: 2,
        },
    ] {
        let out = t.path().join("out");
        std::fs::create_dir(&out).expect("mkdir");
        let e = unpack_to_host_limited(&data[..], &out, "src", SetId::Strip, limits)
            .expect_err("past the limit");
        assert!(LimitExceeded::find(&e).is_some(), "{e}");
        assert_eq!(
            std::fs::read_dir(&out).expect("ls").count(),
            0,
            "left behind"
        );
        std::fs::remove_dir(&out).expect("rmdir");
        let e = retar_limited(&data[..], "src", SetId::Strip, limits, std::io::sink())
            .expect_err("past the limit");
        assert!(LimitExceeded::find(&e).is_some(), "{e}");
    }
}

#[test]
fn retar_leaves_out_fifos_and_devices() {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind) in [
        ("x", tar::EntryType::Directory),
        ("x/null", tar::EntryType::Char),
        ("x/disk", tar::EntryType::Block),
        ("x/fifo", tar::EntryType::Fifo),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o666);
        h.set_size(0);
        b.append_data(&mut h, name, std::io::empty())
            .expect("entry");
    }
    let data = b.into_inner().expect("tar");
    let got = entries_of(&retarred(&data, SetId::Keep).expect("retar"));
    assert_eq!(got, vec![("x".into(), 'd', 0o666)]);
}

#[test]
fn extract_into_needs_a_directory_and_stays_in_it() {
    let s = Scene::new();
    let data = stream(&[E::Dir("a", 0o750), E::File("a/f", 0o4755, b"kept")]);
    extract_into(&data[..], &s.dest(), None).expect("extract");
    let md = std::fs::metadata(s.dest().join("a/f")).expect("stat");
    assert_eq!(md.mode() & 0o7777, 0o4755, "uploads keep setuid");
    let missing = s.dest().join("missing");
    let e = extract_into(&data[..], &missing, None).expect_err("no dir");
    assert!(e.to_string().contains("no such directory"), "{e}");
    assert!(!missing.exists());
    let e = extract_into(&data[..], &s.dest().join("a/f"), None).expect_err("a file");
    assert!(e.to_string().contains("not a directory"), "{e}");
    let decoy_dir = s.decoy_dir();
    for entries in [
        vec![
            E::Sym("esc", &decoy_dir),
            E::File("esc/pwned", 0o644, b"evil"),
        ],
        vec![E::Hard("h", Path::new("../decoy/file"))],
    ] {
        assert!(extract_into(&stream(&entries)[..], &s.dest(), None).is_err());
        s.assert_decoy_intact();
    }
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    /// Names from a small alphabet, so that entries collide, nest
    /// and climb: `x`, `x/a`, `x/a/..`, `x/b`, `y`, `/x`...
    fn name() -> impl Strategy<Value = String> {
        let part = prop_oneof![Just("a"), Just("b"), Just(".."), Just("."), Just("")];
        (
            prop_oneof![Just("x"), Just("y"), Just("/x"), Just("..")],
            proptest::collection::vec(part, 0..4),
        )
            .prop_map(|(top, rest)| {
                let mut n = top.to_string();
                for p in rest {
                    n.push('/');
                    n.push_str(p);
                }
                n
            })
    }

    /// One raw entry: (name, kind 0 file / 1 dir / 2 symlink / 3 hard
    /// link, link target, mode).
    fn entry() -> impl Strategy<Value = (String, u8, String, u32)> {
        (
            name(),
            0u8..4,
            prop_oneof![name(), Just("/".to_string()), Just("../decoy".to_string())],
            0u32..0o10000,
        )
    }

    /// A stream of `entries` with their names written raw (the tar
    /// crate refuses to write `..`).
    fn raw_stream(entries: &[(String, u8, String, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, kind, target, mode) in entries {
            let mut h = tar::Header::new_old();
            h.set_mode(*mode);
            h.set_mtime(1_600_000_000);
            let data: &[u8] = if *kind == 0 { b"data" } else { b"" };
            h.set_size(data.len() as u64);
            h.set_entry_type(match kind {
                0 => tar::EntryType::Regular,
                1 => tar::EntryType::Directory,
                2 => tar::EntryType::Symlink,
                _ => tar::EntryType::Link,
            });
            let n = name.as_bytes();
            let t = target.as_bytes();
            h.as_old_mut().name[..n.len().min(99)].copy_from_slice(&n[..n.len().min(99)]);
            if *kind >= 2 {
                h.as_old_mut().linkname[..t.len().min(99)].copy_from_slice(&t[..t.len().min(99)]);
            }
            h.set_cksum();
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever a sandbox sends, retar passes on only a stream that
        /// a download unpacks, with nothing outside the destination
        /// touched, no setuid bit, and no entry below a link.
        #[test]
        fn what_retar_passes_on_unpacks_inside(
            entries in proptest::collection::vec(entry(), 0..8)
        ) {
            let data = raw_stream(&entries);
            let mut out = Vec::new();
            if retar(&data[..], "x", SetId::Strip, &mut out).is_ok() {
                let s = Scene::new();
                let mut names = Vec::new();
                for (name, _, mode) in entries_of(&out) {
                    prop_assert!(mode & 0o6000 == 0, "{name}: setid bits");
                    prop_assert!(
                        name == "x" || name.starts_with("x/"),
                        "{name}: not below x"
                    );
                    prop_assert!(
                        !name.split('/').any(|c| c == ".."),
                        "{name}: climbs"
                    );
                    names.push(name);
                }
                // A download of it may fail (a type clash with what
                // the destination has), but never reaches outside.
                let _ = unpack_to_host(&out[..], &s.dest(), "x", SetId::Strip);
                s.assert_decoy_intact();
            }
        }

        /// Arbitrary bytes: an error or a stream, never a panic.
        #[test]
        fn retar_takes_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut out = Vec::new();
            let _ = retar(&data[..], "x", SetId::Strip, &mut out);
        }
    }
}
