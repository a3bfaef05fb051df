//! Round trips through sifbox's SIF and squashfs code, and interoperation
//! with Debian's `siftool` and squashfs-tools in both directions.
//!
//! The interop tests skip (saying so loudly) only when `siftool` or
//! `mksquashfs`/`unsquashfs` is missing; CI installs them.

use crate::sif_util;

use std::fs::{self, File};
use std::path::Path;
use std::process::Command;

use sif_util::{
    assert_same, file_links_only, have, is_root, make_tree, run, snapshot, without_suid,
};
use sifbox_image::sif::{Arch, DataType, FsType, PartType, Partition, Sif, SifWriter};
use sifbox_image::squash::{self, Owners, PackOptions, UnpackOptions};

fn unpack_opts() -> UnpackOptions {
    if is_root() {
        UnpackOptions {
            owners: Owners::Preserve,
            ..UnpackOptions::default()
        }
    } else {
        UnpackOptions::for_caller()
    }
}

/// Packs `tree` and wraps it in a SIF with a deffile, labels and a JSON object.
fn make_sif(tree: &Path, sqfs: &Path, sif: &Path) {
    squash::pack(tree, sqfs, &PackOptions::default()).expect("pack");
    let mut w = SifWriter::new();
    w.add_deffile(b"Bootstrap: scratch\n".to_vec())
        .expect("deffile");
    w.add_labels(b"{\"org.label\":\"x\"}".to_vec())
        .expect("labels");
    w.add_json("sifbox.json", b"{\"env\":[\"A=1\"]}".to_vec())
        .expect("json");
    w.add_partition(
        File::open(sqfs).expect("open sqfs"),
        Partition::primary_squashfs(Arch::host()),
    )
    .expect("partition");
    w.write_to(File::create(sif).expect("create sif"))
        .expect("write sif");
}

#[test]
fn round_trip_tree_through_sif() {
    let tmp = tempfile::tempdir().expect("tmp");
    let tree = tmp.path().join("tree");
    make_tree(&tree, 10_000);
    let want = snapshot(&tree);
    assert!(want.entries.len() > 10_000);
    assert_eq!(want.links.len(), 2);

    let sqfs = tmp.path().join("rootfs.sqfs");
    let sif_path = tmp.path().join("image.sif");
    make_sif(&tree, &sqfs, &sif_path);

    let sif = Sif::open(&sif_path).expect("open sif");
    assert_eq!(sif.header().arch, Arch::host());
    let kinds: Vec<DataType> = sif.descriptors().iter().map(|d| d.data_type).collect();
    assert_eq!(
        kinds,
        [
            DataType::Deffile,
            DataType::Labels,
            DataType::GenericJson,
            DataType::Partition
        ]
    );
    assert_eq!(
        sif.read_object(1, 1 << 20).expect("deffile"),
        b"Bootstrap: scratch\n"
    );
    assert_eq!(sif.descriptors()[2].name, "sifbox.json");
    let part = sif.primary_partition().expect("primary partition");
    assert_eq!(part.offset % 4096, 0);
    assert_eq!(part.size, fs::metadata(&sqfs).expect("stat").len());

    let out = tmp.path().join("out");
    let stats = squash::unpack_at(sif.file(), part.offset, part.size, &out, &unpack_opts())
        .expect("unpack");
    assert_eq!(stats.hard_links, 3);
    assert!(stats.files >= 10_000);
    assert_same(&want, &snapshot(&out), is_root());

    // Unpacking again into a non-empty destination is refused.
    let again = squash::unpack_at(sif.file(), part.offset, part.size, &out, &unpack_opts());
    assert!(
        matches!(again, Err(squash::SquashError::DestNotEmpty { .. })),
        "{again:?}"
    );
}

#[test]
fn unpack_for_caller_owns_everything() {
    let tmp = tempfile::tempdir().expect("tmp");
    let tree = tmp.path().join("tree");
    make_tree(&tree, 10);
    let sqfs = tmp.path().join("x.sqfs");
    squash::pack(&tree, &sqfs, &PackOptions::default()).expect("pack");
    let out = tmp.path().join("out");
    squash::unpack(&sqfs, &out, &UnpackOptions::for_caller()).expect("unpack");
    let me = rustix::process::geteuid().as_raw();
    let snap = snapshot(&out);
    for (path, info) in &snap.entries {
        assert_eq!(info.uid, me, "{}", path.display());
    }
    assert_same(&snapshot(&tree), &snap, false);
}

#[test]
fn siftool_and_unsquashfs_read_what_sifbox_writes() {
    if !have("siftool") || !have("unsquashfs") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let tree = tmp.path().join("tree");
    make_tree(&tree, 300);
    let sqfs = tmp.path().join("rootfs.sqfs");
    let sif = tmp.path().join("image.sif");
    make_sif(&tree, &sqfs, &sif);

    let list = run(Command::new("siftool").arg("list").arg(&sif));
    assert!(list.contains("Def.FILE"), "{list}");
    assert!(list.contains("FS (Squashfs/*System/"), "{list}");
    let header = run(Command::new("siftool").arg("header").arg(&sif));
    let host = Arch::host().name().expect("known arch");
    assert!(
        header.contains(&format!("Primary Architecture: {host}")),
        "{header}"
    );
    assert!(header.contains("Descriptors Total:    48"), "{header}");
    let info = run(Command::new("siftool").args(["info", "4"]).arg(&sif));
    assert!(info.contains("Filesystem Type:  Squashfs"), "{info}");
    assert!(info.contains("Partition Type:   *System"), "{info}");
    assert!(
        info.contains(&format!("Architecture:     {host}")),
        "{info}"
    );
    assert!(info.contains("Group ID:         1"), "{info}");

    let dumped = Command::new("siftool")
        .args(["dump", "4"])
        .arg(&sif)
        .output()
        .expect("dump");
    assert!(dumped.status.success());
    assert_eq!(
        dumped.stdout,
        fs::read(&sqfs).expect("read sqfs"),
        "dump is the partition"
    );
    let part = tmp.path().join("part.sqfs");
    fs::write(&part, &dumped.stdout).expect("write part");
    let out = tmp.path().join("unsquashed");
    run(Command::new("unsquashfs")
        .arg("-no-progress")
        .arg("-d")
        .arg(&out)
        .arg(&part));
    if is_root() {
        assert_same(&snapshot(&tree), &snapshot(&out), true);
    } else {
        // unsquashfs leaves out setuid and setgid bits for ordinary users.
        assert_same(
            &without_suid(snapshot(&tree)),
            &without_suid(snapshot(&out)),
            false,
        );
    }
}

#[test]
fn sifbox_reads_what_siftool_and_mksquashfs_write() {
    if !have("siftool") || !have("mksquashfs") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let tree = tmp.path().join("tree");
    make_tree(&tree, 300);
    let sqfs = tmp.path().join("x.sqfs");
    run(Command::new("mksquashfs").arg(&tree).arg(&sqfs).args([
        "-comp",
        "gzip",
        "-noappend",
        "-no-progress",
        "-quiet",
    ]));
    let sif = tmp.path().join("f.sif");
    run(Command::new("siftool").arg("new").arg(&sif));
    run(Command::new("siftool")
        .arg("add")
        .args([
            "--datatype",
            "4",
            "--parttype",
            "2",
            "--partfs",
            "1",
            "--partarch",
            "2",
        ])
        .arg(&sif)
        .arg(&sqfs));

    let opened = Sif::open(&sif).expect("open siftool's SIF");
    assert_eq!(opened.header().arch, Arch::AMD64);
    let part = opened.primary_partition().expect("primary partition");
    assert_eq!(
        part.partition,
        Some(Partition {
            fs: FsType::Squashfs,
            part_type: PartType::PrimarySystem,
            arch: Arch::AMD64
        })
    );
    assert_eq!(part.offset % 4096, 0);
    let out = tmp.path().join("out");
    squash::unpack_at(opened.file(), part.offset, part.size, &out, &unpack_opts()).expect("unpack");
    assert_same(
        &file_links_only(snapshot(&tree)),
        &file_links_only(snapshot(&out)),
        is_root(),
    );
}

/// Unmounts on drop, so a failing assertion leaves no mount behind.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn kernel_mounts_the_sif_partition() {
    if !is_root() {
        eprintln!("\n!!! SKIPPED: mounting the partition with the kernel needs root !!!\n");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let tree = tmp.path().join("tree");
    make_tree(&tree, 300);
    let sqfs = tmp.path().join("rootfs.sqfs");
    let sif_path = tmp.path().join("image.sif");
    make_sif(&tree, &sqfs, &sif_path);
    let sif = Sif::open(&sif_path).expect("open");
    let part = sif.primary_partition().expect("partition");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).expect("mnt");
    // As Apptainer does: a loop device over the partition's byte range.
    let opts = format!("loop,ro,offset={},sizelimit={}", part.offset, part.size);
    let out = Command::new("mount")
        .args(["-t", "squashfs", "-o", &opts])
        .arg(&sif_path)
        .arg(&mnt)
        .output()
        .expect("run mount");
    if !out.status.success() {
        eprintln!(
            "\n!!! SKIPPED: cannot loop-mount here: {} !!!\n",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    let mounted = Mounted(mnt.clone());
    assert_same(&snapshot(&tree), &snapshot(&mnt), true);
    drop(mounted);
}

#[test]
fn hard_links_pack_as_one_inode_that_unsquashfs_and_unpack_keep() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().expect("tmp");
    let tree = tmp.path().join("tree");
    fs::create_dir_all(tree.join("d")).expect("mkdir");
    fs::write(tree.join("h1"), b"x\n").expect("write");
    fs::hard_link(tree.join("h1"), tree.join("h2")).expect("link");
    fs::hard_link(tree.join("h1"), tree.join("d/h3")).expect("link");
    let sqfs = tmp.path().join("links.sqfs");
    squash::pack(&tree, &sqfs, &PackOptions::default()).expect("pack");
    // One inode, three directory entries naming it.
    let f = File::open(&sqfs).expect("open");
    let len = f.metadata().expect("stat").len();
    let stats = squash::verify_at(&f, 0, len, 1).expect("verify");
    assert_eq!((stats.inodes, stats.files, stats.hard_links), (3, 1, 2));
    let one_inode = |root: &Path| {
        let names = ["h1", "h2", "d/h3"].map(|n| fs::metadata(root.join(n)).expect("stat"));
        assert!(
            names
                .iter()
                .all(|m| m.ino() == names[0].ino() && m.nlink() == 3),
            "{}: {:?}",
            root.display(),
            names
                .iter()
                .map(|m| (m.ino(), m.nlink()))
                .collect::<Vec<_>>()
        );
    };
    let out = tmp.path().join("out");
    squash::unpack(&sqfs, &out, &unpack_opts()).expect("unpack");
    one_inode(&out);
    if !have("unsquashfs") {
        return;
    }
    let list = run(Command::new("unsquashfs").arg("-lls").arg(&sqfs));
    for name in ["squashfs-root/h1", "squashfs-root/h2", "squashfs-root/d/h3"] {
        assert!(list.lines().any(|l| l.ends_with(name)), "{name}: {list}");
    }
    let theirs = tmp.path().join("theirs");
    run(Command::new("unsquashfs")
        .args(["-no-progress", "-d"])
        .arg(&theirs)
        .arg(&sqfs));
    one_inode(&theirs);
}
