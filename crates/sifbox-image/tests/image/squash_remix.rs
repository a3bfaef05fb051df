//! `squash::remix`: an image remade with edits holds exactly what packing
//! the edited tree gives (types, modes, owners, times, contents, hard
//! links), read back by sifbox's unpacker and by squashfs-tools'
//! `unsquashfs`; the base's data is reused, not compressed again; the
//! output is deterministic and passes `verify_at`. Checked on a tricky
//! tree, on an image made by mksquashfs, and on random trees with random
//! edits (property test).

use crate::sif_util;

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use sif_util::{
    assert_same, have, is_root, make_tree, run, set_mtime, snapshot, without_suid, Snapshot,
};
use sifbox_image::relink;
use sifbox_image::squash::{
    self, Attrs, Edit, FileSource, OpenFile, PackOptions, RemixOptions, RemixStats, SquashError,
    UnpackOptions,
};

/// The options the tests remix with.
fn remix_opts(time: u32) -> RemixOptions {
    RemixOptions {
        time,
        owner: (0, 0),
        compression_level: 6,
    }
}

fn remix_file(
    img: &Path,
    edits: &[Edit],
    opts: &RemixOptions,
    out: &Path,
) -> Result<RemixStats, SquashError> {
    let f = File::open(img).expect("open base");
    let len = f.metadata().expect("stat").len();
    squash::remix(&f, 0, len, edits, opts, out)
}

fn unpack_opts() -> UnpackOptions {
    if is_root() {
        UnpackOptions::default()
    } else {
        UnpackOptions::for_caller()
    }
}

/// The tree sifbox unpacks from `img` (into `dest`).
fn unpacked(img: &Path, dest: &Path) -> Snapshot {
    squash::unpack(img, dest, &unpack_opts()).expect("sifbox unpacks it");
    snapshot(dest)
}

/// The tree `unsquashfs` extracts from `img` (into `dest`).
fn unsquashed(img: &Path, dest: &Path) -> Snapshot {
    run(Command::new("unsquashfs")
        .arg("-no-progress")
        .arg("-d")
        .arg(dest)
        .arg(img));
    snapshot(dest)
}

/// Compares two reads of one image; unsquashfs run by an ordinary user
/// leaves out setuid and setgid bits and owners.
fn assert_same_read(sifbox: &Snapshot, unsquashfs: &Snapshot) {
    if is_root() {
        assert_same(sifbox, unsquashfs, true);
    } else {
        assert_same(
            &without_suid(sifbox.clone()),
            &without_suid(unsquashfs.clone()),
            false,
        );
    }
}

/// The final times of the model's directories that its edits changed
/// (set once every edit is applied: making entries moves them).
type DirTimes = std::collections::BTreeMap<PathBuf, i64>;

/// Remembers the time `dir` has now as its final one, unless an edit gave
/// it one: an entry is about to be made in it by an edit that leaves its
/// time alone.
fn keep_time(dir: &Path, times: &mut DirTimes) {
    use std::os::unix::fs::MetadataExt;
    if !times.contains_key(dir) {
        let m = fs::symlink_metadata(dir).expect("stat dir");
        times.insert(dir.to_path_buf(), m.mtime());
    }
}

/// Applies `edit` to the tree at `root` the way the remix is specified to
/// (what writing files through the file system does), never following a
/// symlink. `false` when the remix must refuse it as unsupported (a
/// symlink or a non-directory on the way, a directory or a symlink where
/// a file is written, a non-directory where a directory is asked for; for
/// the edits with attributes also a missing parent, an entry where a new
/// file goes, a directory of another mode or owner).
fn apply_model(root: &Path, edit: &Edit, time: u32, times: &mut DirTimes) -> bool {
    use std::os::unix::fs::MetadataExt;
    let names: Vec<&str> = edit.path().split('/').filter(|c| !c.is_empty()).collect();
    if let Edit::DirAs { attrs, .. } | Edit::NewFile { attrs, .. } = edit {
        let mut cur = root.to_path_buf();
        let (last, parents) = match names.split_last() {
            Some((l, p)) => (Some(*l), p),
            None => (None, &names[..]),
        };
        for name in parents {
            cur.push(name);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                _ => return false,
            }
        }
        let parent = cur.clone();
        if let Some(l) = last {
            cur.push(l);
        }
        let there = fs::symlink_metadata(&cur);
        let mtime = i64::from(attrs.mtime.min(time));
        let chown = |p: &Path| {
            if is_root() {
                rustix::fs::chownat(
                    rustix::fs::CWD,
                    p,
                    Some(rustix::fs::Uid::from_raw(attrs.uid)),
                    Some(rustix::fs::Gid::from_raw(attrs.gid)),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .expect("chown");
            }
        };
        match edit {
            Edit::DirAs { .. } => match there {
                Ok(m) if m.is_dir() => {
                    let want = (u32::from(attrs.mode & 0o7777), attrs.uid, attrs.gid);
                    if (m.mode() & 0o7777, m.uid(), m.gid()) != want {
                        return false;
                    }
                    times.insert(cur, mtime);
                }
                Ok(_) => return false,
                Err(_) => {
                    keep_time(&parent, times);
                    fs::create_dir(&cur).expect("mkdir");
                    chown(&cur);
                    fs::set_permissions(&cur, fs::Permissions::from_mode(u32::from(attrs.mode)))
                        .expect("chmod");
                    times.insert(cur, mtime);
                }
            },
            Edit::NewFile { data, .. } => {
                if there.is_ok() {
                    return false;
                }
                keep_time(&parent, times);
                let bytes = match data {
                    FileSource::Bytes(b) => b.clone(),
                    FileSource::Open(f) => {
                        let mut b = vec![0u8; usize::try_from(f.size()).expect("size")];
                        std::os::unix::fs::FileExt::read_exact_at(f.as_file(), &mut b, 0)
                            .expect("read");
                        b
                    }
                };
                fs::write(&cur, bytes).expect("write");
                chown(&cur);
                fs::set_permissions(&cur, fs::Permissions::from_mode(u32::from(attrs.mode)))
                    .expect("chmod");
                set_mtime(&cur, mtime);
            }
            _ => unreachable!(),
        }
        return true;
    }
    let Some((last, parents)) = names.split_last() else {
        return false;
    };
    let made_in = |dir: &Path, times: &mut DirTimes| {
        times.insert(dir.to_path_buf(), i64::from(time));
    };
    // What an edit makes has the remix's owner, whatever the directory it
    // is made in: a setgid parent gives its group to what is made in it on
    // a file system, not to an entry the remix writes.
    let own = |p: &Path| {
        if is_root() {
            let (uid, gid) = remix_opts(time).owner;
            rustix::fs::chownat(
                rustix::fs::CWD,
                p,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .expect("chown");
        }
    };
    let mkdir = |p: &Path| {
        fs::create_dir(p).expect("mkdir");
        own(p);
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).expect("chmod");
    };
    let mut cur = root.to_path_buf();
    for name in parents {
        let dir = cur.clone();
        cur.push(name);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return false,
            Err(_) => {
                mkdir(&cur);
                made_in(&dir, times);
                // New: the edits' time (unless a later edit changes it).
                times.insert(cur.clone(), i64::from(time));
            }
        }
    }
    let dir = cur.clone();
    cur.push(last);
    let there = fs::symlink_metadata(&cur);
    match edit {
        Edit::Dir { .. } => match there {
            Ok(m) => m.is_dir(),
            Err(_) => {
                mkdir(&cur);
                made_in(&dir, times);
                times.insert(cur.clone(), i64::from(time));
                true
            }
        },
        Edit::FileIfMissing { .. } => {
            if there.is_err() {
                File::create(&cur).expect("create");
                own(&cur);
                fs::set_permissions(&cur, fs::Permissions::from_mode(0o644)).expect("chmod");
                made_in(&dir, times);
                set_mtime(&cur, i64::from(time));
            }
            true
        }
        Edit::File { data, mode, .. } => {
            if there.as_ref().is_ok_and(|m| !m.is_file()) {
                return false;
            }
            if there.is_err() {
                made_in(&dir, times);
            }
            // Through the existing file, when there is one: every name of
            // it changes.
            fs::write(&cur, data).expect("write");
            if there.is_err() {
                own(&cur);
            }
            fs::set_permissions(&cur, fs::Permissions::from_mode(u32::from(*mode))).expect("chmod");
            set_mtime(&cur, i64::from(time));
            true
        }
        Edit::DirAs { .. } | Edit::NewFile { .. } => unreachable!(),
    }
}

/// Copies a tree keeping everything (`cp -a`: hard links, owners, times).
fn copy_tree(from: &Path, to: &Path) {
    run(Command::new("cp").arg("-a").arg(from).arg(to));
}

/// Checks `remix(pack(src), edits)` against `pack(src + edits)` for one
/// tree: both read by sifbox, the remix also by unsquashfs; returns the
/// remix's stats, or `None` when the edits are unsupported (and the remix
/// said so).
fn check_against_model(
    tmp: &Path,
    src: &Path,
    edits: &[Edit],
    time: u32,
    pack: &PackOptions,
) -> Option<RemixStats> {
    let base = tmp.join("base.sqfs");
    squash::pack(src, &base, pack).expect("pack base");
    let model = tmp.join("model");
    copy_tree(src, &model);
    let mut times = DirTimes::new();
    let supported = edits
        .iter()
        .all(|e| apply_model(&model, e, time, &mut times));
    for (dir, t) in &times {
        if supported {
            set_mtime(dir, *t);
        }
    }
    let out = tmp.join("remix.sqfs");
    let r = remix_file(&base, edits, &remix_opts(time), &out);
    if !supported {
        assert!(
            matches!(r, Err(SquashError::Unsupported { .. })),
            "edits the model refuses: {r:?}"
        );
        return None;
    }
    let stats = r.expect("remix");
    let want_img = tmp.join("model.sqfs");
    let model_opts = PackOptions {
        mkfs_time: Some(time),
        clamp_mtime: Some(time),
        ..pack.clone()
    };
    squash::pack(&model, &want_img, &model_opts).expect("pack model");
    let want = unpacked(&want_img, &tmp.join("want"));
    let got = unpacked(&out, &tmp.join("got"));
    assert_same(&want, &got, is_root());
    if stats.clamped == 0 && stats.rewritten_links == 0 && is_root() {
        // The same tree made from the base's tree, by links and the edits.
        let base_tree = unpacked(&base, &tmp.join("base-tree"));
        let bytes = fs::read(&base).expect("read base");
        let newest = u32::from_le_bytes(bytes[8..12].try_into().expect("4"));
        let r = relink::make_tree(
            &tmp.join("base-tree"),
            &tmp.join("relinked"),
            edits,
            &remix_opts(time),
            relink::TreeOwners::Recorded,
            newest,
        )
        .expect("relinked");
        assert_same(&got, &snapshot(&tmp.join("relinked")), true);
        let files = base_tree
            .entries
            .values()
            .filter(|i| i.kind != "dir" && i.mode & 0o6000 == 0)
            .count() as u64;
        assert!(r.linked <= files, "{r:?}");
    }
    if have("unsquashfs") {
        assert_same_read(&got, &unsquashed(&out, &tmp.join("unsquashed")));
    }
    squash::verify_at(&File::open(&out).expect("open"), 0, stats.image_bytes, 1)
        .expect("the remix verifies");
    Some(stats)
}

/// Edits like the ones a build makes: a new directory, files replaced and
/// new, an empty file where missing, and a file written through a hard
/// link.
fn layout_edits() -> Vec<Edit> {
    vec![
        Edit::Dir {
            path: ".singularity.d/env".into(),
        },
        Edit::Dir { path: "etc".into() },
        Edit::FileIfMissing {
            path: "etc/hosts".into(),
        },
        Edit::FileIfMissing {
            path: "etc/hostname".into(),
        },
        Edit::File {
            path: ".singularity.d/labels.json".into(),
            data: b"{\n  \"a\": \"b\"\n}".to_vec(),
            mode: 0o644,
        },
        Edit::File {
            path: ".singularity.d/env/10-docker2singularity.sh".into(),
            data: b"#!/bin/sh\nexport PATH=\"/bin\"\n".to_vec(),
            mode: 0o755,
        },
        Edit::File {
            path: ".singularity.d/runscript".into(),
            data: b"#!/bin/sh\n".to_vec(),
            mode: 0o755,
        },
        Edit::File {
            path: ".singularity.d/startscript".into(),
            data: b"#!/bin/sh\n".to_vec(),
            mode: 0o755,
        },
        // Replaced in place: its other names see it too.
        Edit::File {
            path: "usr/bin/busy".into(),
            data: b"replaced\n".to_vec(),
            mode: 0o700,
        },
        // More than a block: stored in blocks, not a fragment.
        Edit::File {
            path: "opt/big/data.bin".into(),
            data: (0..300_000u32).map(|i| (i % 97).to_le_bytes()[0]).collect(),
            mode: 0o644,
        },
        Edit::File {
            path: "etc/empty-file".into(),
            data: Vec::new(),
            mode: 0o600,
        },
    ]
}

#[test]
fn a_remixed_tricky_tree_is_the_packed_edited_tree() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    make_tree(&src, 2000);
    // Some entries of the tree are newer than this, some older.
    let time = 1_600_000_000 + 17 * 1000;
    let stats = check_against_model(
        tmp.path(),
        &src,
        &layout_edits(),
        time,
        &PackOptions::default(),
    )
    .expect("supported");
    // The base's data was copied, not compressed again: it is all there.
    let base_len = fs::metadata(tmp.path().join("base.sqfs"))
        .expect("stat")
        .len();
    assert!(stats.copied_bytes > 0 && stats.copied_bytes < base_len);
    let base = fs::read(tmp.path().join("base.sqfs")).expect("read");
    let out = fs::read(tmp.path().join("remix.sqfs")).expect("read");
    let region = 96..96 + usize::try_from(stats.copied_bytes).expect("usize");
    assert_eq!(base[region.clone()], out[region], "data region reused");
    // Identical new contents stored once.
    assert_eq!(
        stats.new_bytes,
        layout_edits()
            .iter()
            .filter_map(|e| match e {
                Edit::File { data, .. } => Some(data.len() as u64),
                _ => None,
            })
            .sum::<u64>()
            - 10,
        "{stats:?}"
    );
    // The image's own time is the edits' time.
    assert_eq!(u32::from_le_bytes(out[8..12].try_into().expect("4")), time);
}

#[test]
fn the_same_inputs_give_the_same_bytes_also_at_an_offset() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    make_tree(&src, 50);
    let base = tmp.path().join("base.sqfs");
    squash::pack(&src, &base, &PackOptions::default()).expect("pack");
    let opts = remix_opts(1_700_000_000);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    remix_file(&base, &layout_edits(), &opts, &a).expect("a");
    remix_file(&base, &layout_edits(), &opts, &b).expect("b");
    assert_eq!(fs::read(&a).expect("a"), fs::read(&b).expect("b"));
    // The base inside a bigger file, as in a SIF.
    let bytes = fs::read(&base).expect("base");
    let mut f = tempfile::tempfile().expect("temp");
    f.write_all(&[0x55; 8192]).expect("pad");
    f.write_all(&bytes).expect("image");
    f.write_all(&[0xaa; 100]).expect("after");
    let c = tmp.path().join("c");
    squash::remix(&f, 8192, bytes.len() as u64, &layout_edits(), &opts, &c).expect("c");
    assert_eq!(fs::read(&a).expect("a"), fs::read(&c).expect("c"));
}

#[test]
fn an_image_made_by_mksquashfs_remixes() {
    if !have("mksquashfs") || !have("unsquashfs") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    make_tree(&src, 300);
    let base = tmp.path().join("base.sqfs");
    // A compressor options block (a level other than 9) and an export
    // table, which sifbox's own images do not have.
    run(Command::new("mksquashfs").arg(&src).arg(&base).args([
        "-comp",
        "gzip",
        "-Xcompression-level",
        "6",
        "-no-xattrs",
        "-noappend",
        "-no-progress",
        "-quiet",
    ]));
    let out = tmp.path().join("remix.sqfs");
    let time = 1_700_000_000;
    remix_file(&base, &layout_edits(), &remix_opts(time), &out).expect("remix");
    let got = unpacked(&out, &tmp.path().join("got"));
    assert_same_read(&got, &unsquashed(&out, &tmp.path().join("unsquashed")));
    // What the edits left alone reads as the base did.
    let before = unpacked(&base, &tmp.path().join("before"));
    for (path, info) in &before.entries {
        let touched = path.starts_with("usr/bin")
            || path.starts_with("etc")
            || path.starts_with("usr/bin/busy")
            || path.as_os_str().is_empty();
        if !touched {
            assert_eq!(got.entries.get(path), Some(info), "{}", path.display());
        }
    }
    assert_eq!(
        fs::read(tmp.path().join("got/usr/bin/sh-link")).expect("read"),
        b"replaced\n"
    );
}

#[test]
fn an_edit_through_a_symlink_is_unsupported() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    make_tree(&src, 0);
    let edits = [Edit::File {
        // "bin" is a symlink to usr/bin.
        path: "bin/tool".into(),
        data: b"x".to_vec(),
        mode: 0o755,
    }];
    assert!(check_against_model(
        tmp.path(),
        &src,
        &edits,
        1_700_000_000,
        &PackOptions::default()
    )
    .is_none());
}

/// What the edits make in a setgid directory (a dir, its missing parent,
/// new files) has the remix's owner and no setgid bit: an image's entries
/// carry their own owners; a setgid parent gives its group only to what is
/// made in it on a live file system.
#[test]
fn entries_an_edit_makes_in_a_setgid_dir_have_the_remix_owner() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    fs::create_dir(&src).expect("src");
    let (uid, gid) = owner(true);
    let edits = [
        Edit::DirAs {
            path: "a".into(),
            attrs: Attrs {
                mode: 0o2755,
                uid,
                gid,
                mtime: 1_400_000_000,
            },
        },
        Edit::Dir {
            path: "a/b/c".into(),
        },
        Edit::FileIfMissing { path: "a/e".into() },
        Edit::File {
            path: "a/f".into(),
            data: b"f\n".to_vec(),
            mode: 0o644,
        },
    ];
    let time = 1_500_000_000;
    check_against_model(tmp.path(), &src, &edits, time, &PackOptions::default())
        .expect("supported");
    let got = snapshot(&tmp.path().join("got"));
    let info = |p: &str| got.entries.get(Path::new(p)).expect(p).clone();
    if is_root() {
        assert_eq!(
            (info("a").mode, info("a").uid, info("a").gid),
            (0o2755, uid, gid)
        );
    }
    for p in ["a/b", "a/b/c", "a/e", "a/f"] {
        let i = info(p);
        assert_eq!(i.mode & 0o7000, 0, "{p}: {i:?}");
        if is_root() {
            assert_eq!((i.uid, i.gid), remix_opts(time).owner, "{p}: {i:?}");
        }
    }
}

/// A random tree: paths over a small alphabet, with files of 0 to 3
/// blocks (4 KiB blocks), symlinks and hard links.
#[derive(Debug, Clone)]
enum Node {
    Dir,
    File {
        len: usize,
        byte: u8,
        mode: u32,
    },
    Symlink(String),
    /// A hard link to the `n`th file made so far (if any).
    Link(usize),
}

fn name() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", "etc", ".singularity.d"]).prop_map(str::to_string)
}

fn rel_path() -> impl Strategy<Value = String> {
    proptest::collection::vec(name(), 1..4).prop_map(|v| v.join("/"))
}

fn node() -> impl Strategy<Value = Node> {
    prop_oneof![
        Just(Node::Dir),
        (
            0usize..14_000,
            any::<u8>(),
            prop::sample::select(vec![0o644u32, 0o755, 0o600, 0o4755, 0o1777])
        )
            .prop_map(|(len, byte, mode)| Node::File { len, byte, mode }),
        rel_path().prop_map(Node::Symlink),
        (0usize..8).prop_map(Node::Link),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        rel_path().prop_map(|path| Edit::Dir { path }),
        rel_path().prop_map(|path| Edit::FileIfMissing { path }),
        (
            rel_path(),
            0usize..14_000,
            any::<u8>(),
            prop::sample::select(vec![0o644u16, 0o755, 0o600, 0o4755])
        )
            .prop_map(|(path, len, byte, mode)| Edit::File {
                path,
                data: (0..len)
                    .map(|i| byte.wrapping_add((i / 100).to_le_bytes()[0]))
                    .collect(),
                mode,
            }),
    ]
}

/// The owner an edit with attributes gives: the caller's own, or (for
/// root) another one.
fn owner(other: bool) -> (u32, u32) {
    if is_root() && other {
        (1000, 1001)
    } else {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    }
}

fn attrs(modes: Vec<u16>) -> impl Strategy<Value = Attrs> {
    (
        prop::sample::select(modes),
        any::<bool>(),
        1_400_000_000u32..1_800_000_000,
    )
        .prop_map(|(mode, other, mtime)| {
            let (uid, gid) = owner(other);
            Attrs {
                mode,
                uid,
                gid,
                mtime,
            }
        })
}

/// What a build's layer gives for one new entry: its parents as dirs with
/// attributes (copied up, so mostly the base's own: 0755, the caller's),
/// then the entry: a dir (the root too) or a new file with every
/// attribute, its data in memory or in an open file.
fn attrs_edits() -> impl Strategy<Value = Vec<Edit>> {
    let parents = (
        proptest::collection::vec(name(), 0..3),
        1_400_000_000u32..1_800_000_000,
        prop::sample::select(vec![0o755u16, 0o755, 0o755, 0o700]),
    );
    let leaf = prop_oneof![
        (
            prop::sample::select(vec!["a", "b", "n1", "n2", ""]),
            attrs(vec![0o755, 0o700, 0o750, 0o1777, 0o2755])
        )
            .prop_map(|(name, attrs)| (name, None, attrs)),
        (
            prop::sample::select(vec!["n1", "n2", "n3", "c"]),
            0usize..14_000,
            any::<u8>(),
            any::<bool>(),
            attrs(vec![0o644, 0o755, 0o600, 0o4755, 0o2711])
        )
            .prop_map(|(name, len, byte, open, attrs)| {
                let bytes: Vec<u8> = (0..len)
                    .map(|i| byte.wrapping_add((i / 100).to_le_bytes()[0]))
                    .collect();
                let data = if open {
                    let mut f = tempfile::tempfile().expect("temp");
                    f.write_all(&bytes).expect("write");
                    FileSource::Open(OpenFile::new(f).expect("open"))
                } else {
                    FileSource::Bytes(bytes)
                };
                (name, Some(data), attrs)
            }),
    ];
    (parents, leaf).prop_map(|((dirs, mtime, mode), (name, data, attrs))| {
        let (uid, gid) = owner(false);
        let mut out = Vec::new();
        let mut path = String::new();
        for d in dirs {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(&d);
            out.push(Edit::DirAs {
                path: path.clone(),
                attrs: Attrs {
                    mode,
                    uid,
                    gid,
                    mtime,
                },
            });
        }
        if !name.is_empty() {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(name);
        }
        out.push(match data {
            Some(data) => Edit::NewFile { path, data, attrs },
            None => Edit::DirAs { path, attrs },
        });
        out
    })
}

/// Makes the random tree below `root` (entries whose parent is not a
/// directory, or that exist already, are left out); times in 1.5e9..1.7e9.
fn make_random_tree(root: &Path, nodes: &[(String, Node)], times: &[u32]) {
    fs::create_dir_all(root).expect("root");
    let mut files: Vec<PathBuf> = Vec::new();
    let mut made: Vec<PathBuf> = Vec::new();
    'nodes: for (rel, node) in nodes {
        let path = root.join(rel);
        let mut at = root.to_path_buf();
        for c in Path::new(rel)
            .parent()
            .into_iter()
            .flat_map(Path::components)
        {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => continue 'nodes,
                Err(_) => {
                    fs::create_dir(&at).expect("mkdir");
                    made.push(at.clone());
                }
            }
        }
        if fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        match node {
            Node::Dir => fs::create_dir(&path).expect("mkdir"),
            Node::File { len, byte, mode } => {
                let data: Vec<u8> = (0..*len)
                    .map(|i| byte.wrapping_add((i % 7).to_le_bytes()[0]))
                    .collect();
                fs::write(&path, data).expect("write");
                fs::set_permissions(&path, fs::Permissions::from_mode(*mode)).expect("chmod");
                files.push(path.clone());
            }
            Node::Symlink(target) => std::os::unix::fs::symlink(target, &path).expect("symlink"),
            Node::Link(n) => match files.get(*n) {
                Some(f) => fs::hard_link(f, &path).expect("link"),
                None => continue,
            },
        }
        made.push(path);
    }
    // Times last, deepest first, so that making entries changes none.
    made.sort();
    made.push(root.to_path_buf());
    for (i, p) in made.iter().rev().enumerate() {
        set_mtime(p, i64::from(times[i % times.len()]));
    }
}

/// 48 cases (`PROPTEST_CASES` gives another number), the failures
/// recorded in squash_remix.proptest-regressions re-run first (the file
/// next to this one: a test file has no lib.rs or main.rs above it, where
/// proptest's default looks first).
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

/// A random tree made of `nodes` (times from `times`), packed with small
/// blocks, then remixed with `edits` at `time`: checked against the model.
fn check_random_tree(nodes: &[(String, Node)], times: &[u32], edits: &[Edit], time: u32) {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    make_random_tree(&src, nodes, times);
    let pack = PackOptions {
        block_size: 4096,
        ..PackOptions::default()
    };
    check_against_model(tmp.path(), &src, edits, time, &pack);
}

proptest! {
    #![proptest_config(config())]

    /// Random trees with random edits: the remix reads back (by sifbox and
    /// by unsquashfs) as the packed edited tree, or is refused as
    /// unsupported exactly where a symlink or a file is in an edit's way.
    #[test]
    fn random_edits_of_random_trees(
        nodes in proptest::collection::vec((rel_path(), node()), 0..24),
        edits in proptest::collection::vec(edit(), 0..8),
        times in proptest::collection::vec(1_500_000_000u32..1_700_000_000, 1..6),
        time in 1_500_000_000u32..1_700_000_000,
    ) {
        check_random_tree(&nodes, &times, &edits, time);
    }

    /// Random trees with what a build's layers add (dirs and new files
    /// with their own attributes, the root's time), then Apptainer's
    /// layout edits: read back as the packed edited tree, refused exactly
    /// where an entry is replaced, a parent is missing or a dir's mode or
    /// owner differ.
    #[test]
    fn random_added_entries_of_random_trees(
        nodes in proptest::collection::vec((rel_path(), node()), 0..24),
        added in proptest::collection::vec(attrs_edits(), 0..6),
        layout in proptest::collection::vec(edit(), 0..4),
        times in proptest::collection::vec(1_500_000_000u32..1_700_000_000, 1..6),
        time in 1_500_000_000u32..1_700_000_000,
    ) {
        let edits: Vec<Edit> = added.into_iter().flatten().chain(layout).collect();
        check_random_tree(&nodes, &times, &edits, time);
    }
}

/// The tree of a remixed image made from its base's tree (links to the
/// base's files, the edits written anew) is the tree its SIF unpacks to,
/// for the tricky tree (hard links, symlinks, a fifo, devices, setuid
/// files); unchanged files share the base's inodes, setuid ones do not,
/// and the base's tree is left as it was. (No edit rewrites a file of
/// several names: the caller makes such a tree by unpacking.)
#[test]
fn a_relinked_tree_is_the_remixed_images_tree() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    make_tree(&src, 200);
    let time = 2_000_000_000;
    let edits: Vec<Edit> = layout_edits()
        .into_iter()
        .filter(|e| e.path() != "usr/bin/busy")
        .collect();
    // check_against_model makes the tree too (all times are older).
    let stats = check_against_model(tmp.path(), &src, &edits, time, &PackOptions::default())
        .expect("supported");
    assert_eq!((stats.clamped, stats.rewritten_links), (0, 0));
    if !is_root() {
        // check_against_model makes it for root only.
        squash::unpack(
            &tmp.path().join("base.sqfs"),
            &tmp.path().join("base-tree"),
            &unpack_opts(),
        )
        .expect("unpack");
    }
    let before = snapshot(&tmp.path().join("base-tree"));
    let owners = if is_root() {
        relink::TreeOwners::Recorded
    } else {
        relink::TreeOwners::CallerForRoot {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    };
    let dest = tmp.path().join("relinked-2");
    relink::make_tree(
        &tmp.path().join("base-tree"),
        &dest,
        &edits,
        &remix_opts(time),
        owners,
        1_600_000_000 + 17 * 3000,
    )
    .expect("relinked");
    let got = unpacked(&tmp.path().join("remix.sqfs"), &tmp.path().join("got-2"));
    assert_same(&got, &snapshot(&dest), is_root());
    let ino = |p: &Path| fs::symlink_metadata(p).expect("stat").ino();
    let (b, d) = (tmp.path().join("base-tree"), dest);
    assert_eq!(
        ino(&b.join("usr/lib/big.bin")),
        ino(&d.join("usr/lib/big.bin"))
    );
    assert_eq!(ino(&b.join("etc/abs-link")), ino(&d.join("etc/abs-link")));
    assert_ne!(
        ino(&b.join("usr/bin/tool")),
        ino(&d.join("usr/bin/tool")),
        "setuid: copied"
    );
    assert_eq!(
        ino(&b.join("usr/bin/busy")),
        ino(&d.join("usr/bin/sh-link"))
    );
    assert!(fs::symlink_metadata(b.join("opt")).is_err());
    assert!(fs::symlink_metadata(d.join("opt/big/data.bin")).is_ok());
    assert_eq!(snapshot(&b), before, "the base's tree changed");
    // A base tree with an entry newer than the base's time: refused.
    let r = relink::make_tree(
        &b,
        &tmp.path().join("relinked-3"),
        &[],
        &remix_opts(time),
        owners,
        1_600_000_000,
    );
    assert!(r.is_err(), "{r:?}");
}
