//! Shared by the SIF and squashfs suites: build a tricky tree, snapshot a tree, compare.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// True when `tool` runs; otherwise says loudly that the test is skipped.
pub fn have(tool: &str) -> bool {
    let ok = Command::new(tool).arg("--help").output().is_ok();
    if !ok {
        eprintln!(
            "\n!!! SKIPPED: `{tool}` is not installed (apt-get install siftool squashfs-tools) !!!\n"
        );
    }
    ok
}

/// Sets `path`'s access and modification times to `secs`, not following a
/// symlink.
pub fn set_mtime(path: &Path, secs: i64) {
    let t = rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("utimensat");
}

fn write(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).expect("write file");
}

/// Builds a tree with everything the round trip must keep; `many` regular
/// files spread over 100 directories.
pub fn make_tree(root: &Path, many: usize) {
    fs::create_dir_all(root).expect("root");
    let p = |rel: &str| root.join(rel);
    for d in [
        "etc",
        "usr/bin",
        "usr/lib",
        "empty",
        "deep/a/b/c/d/e/f/g",
        "tmp",
        "many",
    ] {
        fs::create_dir_all(p(d)).expect("dir");
    }
    write(&p("etc/hostname"), b"sifbox\n");
    write(&p("etc/empty-file"), b"");
    // A multi-block file with an all-zero block in the middle and a tail.
    let mut big: Vec<u8> = (0..131_072u32)
        .map(|i| (i % 251).to_le_bytes()[0])
        .collect();
    big.extend(std::iter::repeat_n(0u8, 131_072));
    big.extend((0..50_000u32).map(|i| (i * 7 % 253).to_le_bytes()[0]));
    write(&p("usr/lib/big.bin"), &big);
    // Copies (not links): their data is stored once, they stay two files.
    write(&p("usr/lib/big-copy.bin"), &big);
    write(&p("etc/hostname-copy"), b"sifbox\n");
    // Exactly two blocks, nothing in a fragment.
    write(&p("usr/lib/two-blocks.bin"), &vec![0x5a; 262_144]);
    // Only zeros: all holes.
    write(&p("usr/lib/zeros.bin"), &vec![0; 300_000]);
    write(&p("usr/bin/tool"), b"#!/bin/sh\necho tool\n");
    fs::set_permissions(p("usr/bin/tool"), fs::Permissions::from_mode(0o4755)).expect("setuid");
    write(&p("usr/bin/grouped"), b"setgid\n");
    fs::set_permissions(p("usr/bin/grouped"), fs::Permissions::from_mode(0o2711)).expect("setgid");
    fs::set_permissions(p("tmp"), fs::Permissions::from_mode(0o1777)).expect("sticky");
    if is_root() {
        // Unreadable: only root can pack it.
        write(&p("etc/secret"), b"no one\n");
        fs::set_permissions(p("etc/secret"), fs::Permissions::from_mode(0o000)).expect("0");
    }
    // Hard links: three names for one file, across directories.
    write(&p("usr/bin/busy"), b"busybox-ish\n");
    fs::hard_link(p("usr/bin/busy"), p("usr/bin/sh-link")).expect("link");
    fs::hard_link(p("usr/bin/busy"), p("etc/busy-again")).expect("link");
    // Symlinks: relative, absolute, dangling, to a dir.
    symlink("../bin/tool", p("usr/lib/tool-rel")).expect("symlink");
    symlink("/etc/passwd", p("etc/abs-link")).expect("symlink");
    symlink("does/not/exist", p("etc/dangling")).expect("symlink");
    symlink("usr/bin", p("bin")).expect("symlink");
    // A hard link to a symlink (the link itself, not its target).
    fs::hard_link(p("etc/dangling"), p("etc/dangling-too")).expect("link a symlink");
    // Long names: 255 bytes.
    let long = "L".repeat(250) + ".long";
    assert_eq!(long.len(), 255);
    write(&root.join("deep").join(&long), b"long name\n");
    fs::create_dir(root.join("deep/a").join("d".repeat(255))).expect("long dir");
    write(&p("deep/a/b/c/d/e/f/g/leaf"), b"leaf\n");
    // A fifo, and a device node when allowed.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p("tmp/fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("fifo");
    if is_root() {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            p("etc/null"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        )
        .expect("mknod");
        // The file's owner, and the symlink's own (not followed).
        for (name, uid, gid, flags) in [
            ("etc/hostname", 1234, 5678, rustix::fs::AtFlags::empty()),
            (
                "etc/abs-link",
                42,
                43,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            ),
        ] {
            rustix::fs::chownat(
                rustix::fs::CWD,
                p(name),
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                flags,
            )
            .unwrap_or_else(|e| panic!("chown {name}: {e}"));
        }
    }
    for i in 0..many {
        let dir = p(&format!("many/d{:03}", i % 100));
        if i < 100 {
            fs::create_dir(&dir).expect("many dir");
        }
        write(
            &dir.join(format!("file-{i:05}")),
            format!("content of file {i}\n").as_bytes(),
        );
    }
    // Distinct times, directories last (creating entries changes them).
    let mut n = 0i64;
    let mut all: Vec<PathBuf> = Vec::new();
    collect(root, &mut all);
    all.sort();
    for path in all.iter().rev() {
        n += 1;
        set_mtime(path, 1_600_000_000 + n * 17);
    }
    set_mtime(root, 1_500_000_000);
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("read_dir") {
        let path = e.expect("entry").path();
        let meta = fs::symlink_metadata(&path).expect("lstat");
        if meta.is_dir() {
            collect(&path, out);
        }
        out.push(path);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub size: u64,
    pub sha: String,
    pub target: String,
    pub rdev: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub entries: BTreeMap<PathBuf, Info>,
    /// Each group of names that share one inode (all but directories).
    pub links: BTreeSet<Vec<PathBuf>>,
}

pub fn snapshot(root: &Path) -> Snapshot {
    let mut all = Vec::new();
    collect(root, &mut all);
    all.push(root.to_path_buf());
    let mut entries = BTreeMap::new();
    let mut inodes: HashMap<(u64, u64), Vec<PathBuf>> = HashMap::new();
    for path in all {
        let m = fs::symlink_metadata(&path).expect("lstat");
        let rel = path.strip_prefix(root).expect("prefix").to_path_buf();
        let ft = m.file_type();
        use std::os::unix::fs::FileTypeExt;
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_fifo() {
            "fifo"
        } else if ft.is_char_device() {
            "char"
        } else if ft.is_block_device() {
            "block"
        } else {
            "socket"
        };
        let mut info = Info {
            kind,
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            mtime: m.mtime(),
            size: 0,
            sha: String::new(),
            target: String::new(),
            rdev: 0,
        };
        if ft.is_file() {
            info.size = m.len();
            info.sha = hex::encode(Sha256::digest(fs::read(&path).expect("read")));
        } else if ft.is_symlink() {
            info.target = fs::read_link(&path)
                .expect("readlink")
                .display()
                .to_string();
            info.mode = 0; // not meaningful for symlinks
        } else if ft.is_char_device() || ft.is_block_device() {
            info.rdev = m.rdev();
        }
        if !ft.is_dir() {
            inodes
                .entry((m.dev(), m.ino()))
                .or_default()
                .push(rel.clone());
        }
        entries.insert(rel, info);
    }
    let links = inodes
        .into_values()
        .filter(|v| v.len() > 1)
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    Snapshot { entries, links }
}

/// Panics with the first differences between two snapshots. With
/// `owners == false` uid and gid are not compared (an unprivileged unpack).
pub fn assert_same(want: &Snapshot, got: &Snapshot, owners: bool) {
    let mut diffs = Vec::new();
    for (k, a) in &want.entries {
        match got.entries.get(k) {
            None => diffs.push(format!("missing {}", k.display())),
            Some(b) => {
                let (mut a, mut b) = (a.clone(), b.clone());
                if !owners {
                    (a.uid, a.gid, b.uid, b.gid) = (0, 0, 0, 0);
                }
                if a != b {
                    diffs.push(format!("{}: want {a:?}, got {b:?}", k.display()));
                }
            }
        }
    }
    for k in got.entries.keys() {
        if !want.entries.contains_key(k) {
            diffs.push(format!("extra {}", k.display()));
        }
    }
    if want.links != got.links {
        diffs.push(format!(
            "hard links: want {:?}, got {:?}",
            want.links, got.links
        ));
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs[..diffs.len().min(20)].join("\n")
    );
}

/// Clears setuid and setgid bits, which unsquashfs drops when not run as root.
pub fn without_suid(mut s: Snapshot) -> Snapshot {
    for info in s.entries.values_mut() {
        // Directories too: unsquashfs leaves out a setgid directory's bit.
        info.mode &= !0o6000;
    }
    s
}

/// Keeps only the hard-link groups of regular files (mksquashfs does not
/// always keep a hard-linked symlink as one inode).
pub fn file_links_only(mut s: Snapshot) -> Snapshot {
    let entries = &s.entries;
    s.links.retain(|group| {
        group
            .first()
            .and_then(|p| entries.get(p))
            .is_some_and(|i| i.kind == "file")
    });
    s
}

/// Runs a command, panicking with its output when it fails; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
