//! With SOURCE_DATE_EPOCH set, the same tree gives byte-identical squashfs
//! and SIF files, wherever the tree lives and whatever its inode numbers.
//! The variable is process-wide, and the other suites share this binary:
//! the test runs itself again in a process of its own that has it set.

use crate::sif_util;

use std::fs::{self, File};
use std::path::Path;
use std::process::Command;

use sif_util::{make_tree, run};
use sifbox_image::sif::{Arch, Partition, Sif, SifWriter};
use sifbox_image::squash::{self, PackOptions};

const EPOCH: i64 = 1_700_000_000;

fn build(tree: &Path, dir: &Path) -> Vec<u8> {
    fs::create_dir_all(dir).expect("dir");
    let sqfs = dir.join("rootfs.sqfs");
    let opts = PackOptions::from_env();
    assert_eq!(opts.mkfs_time, u32::try_from(EPOCH).ok());
    squash::pack(tree, &sqfs, &opts).expect("pack");
    let mut w = SifWriter::from_env();
    w.add_deffile(b"Bootstrap: scratch\n".to_vec())
        .expect("deffile");
    w.add_json("config.json", b"{}".to_vec()).expect("json");
    w.add_partition(
        File::open(&sqfs).expect("sqfs"),
        Partition::primary_squashfs(Arch::AMD64),
    )
    .expect("partition");
    let sif = dir.join("image.sif");
    w.write_to(File::create(&sif).expect("create"))
        .expect("write");
    let opened = Sif::open(&sif).expect("open");
    assert_eq!(opened.header().id, [0u8; 16]);
    assert_eq!(
        (opened.header().created, opened.header().modified),
        (EPOCH, EPOCH)
    );
    assert!(opened
        .descriptors()
        .iter()
        .all(|d| d.created == EPOCH && d.modified == EPOCH));
    fs::read(&sif).expect("read")
}

#[test]
fn source_date_epoch_gives_identical_files() {
    if std::env::var("SOURCE_DATE_EPOCH").ok() != Some(EPOCH.to_string()) {
        // This test's name as the harness knows it: its module path
        // without the crate's name.
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let name = format!("{module}::source_date_epoch_gives_identical_files");
        let out = Command::new(std::env::current_exe().expect("current exe"))
            .args([name.as_str(), "--exact", "--test-threads=1"])
            .env("SOURCE_DATE_EPOCH", EPOCH.to_string())
            .output()
            .expect("run the test in a process of its own");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{name} with SOURCE_DATE_EPOCH={EPOCH}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let a = tmp.path().join("a");
    make_tree(&a, 2_000);
    // One file newer than the epoch (clamped to it in the image).
    run(Command::new("touch")
        .args(["-m", "-d", "@1800000000"])
        .arg(a.join("etc/hostname")));
    let first = build(&a, &tmp.path().join("out1"));
    let second = build(&a, &tmp.path().join("out2"));
    assert!(first == second, "two writes of the same tree differ");

    // A copy elsewhere (new inode numbers, new directory order on disk), with
    // that file touched now: both times are after the epoch, so clamped to it.
    let b = tmp.path().join("b");
    run(Command::new("cp").arg("-a").arg(&a).arg(&b));
    run(Command::new("touch").arg("-m").arg(b.join("etc/hostname")));
    let third = build(&b, &tmp.path().join("out3"));
    assert!(first == third, "a copy of the tree packs differently");
}
