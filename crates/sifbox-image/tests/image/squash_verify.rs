//! `squash::verify_at`: a sound image passes (sifbox's own, mksquashfs's
//! gzip and zstd ones); a flipped byte in a compressed data block, in the
//! inode table or in a directory, a truncated image and a `bytes_used`
//! past the partition are refused as corrupt; random damage never panics
//! it, and an image it passes always unpacks.

use crate::sif_util;

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use proptest::prelude::*;
use sif_util::{have, make_tree};
use sifbox_image::squash::{self, PackOptions, SquashError, UnpackOptions};

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Superblock fields (offsets of squashfs 4.0).
const BYTES_USED: usize = 40;
const INODE_TABLE: usize = 64;
const DIR_TABLE: usize = 72;

fn verify(bytes: &[u8]) -> Result<squash::VerifyStats, SquashError> {
    let mut f = tempfile::tempfile().expect("temp file");
    f.write_all(bytes).expect("write");
    squash::verify_at(&f, 0, bytes.len() as u64, 2)
}

/// A small tree whose data compresses (text), with a hard link and a
/// multi-block file, packed by sifbox.
fn image() -> Vec<u8> {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    let text: Vec<u8> = (0..400_000u32)
        .flat_map(|i| format!("line {i} of a compressible file\n").into_bytes())
        .take(400_000)
        .collect();
    std::fs::write(src.join("a-big.txt"), &text).expect("write");
    std::fs::write(src.join("d/small"), b"small file\n").expect("write");
    std::fs::hard_link(src.join("d/small"), src.join("d/again")).expect("link");
    std::os::unix::fs::symlink("d/small", src.join("link")).expect("symlink");
    let out = t.path().join("x.sqfs");
    squash::pack(&src, &out, &PackOptions::default()).expect("pack");
    std::fs::read(out).expect("read")
}

#[track_caller]
fn corrupt(r: Result<squash::VerifyStats, SquashError>) -> String {
    match r {
        Err(e @ (SquashError::Corrupt { .. } | SquashError::NotSquashfs)) => e.to_string(),
        other => panic!("expected a corrupt image, got {other:?}"),
    }
}

#[test]
fn a_sound_image_passes_and_is_counted() {
    let img = image();
    let stats = verify(&img).expect("sound");
    // root, a-big.txt, d, d/small (twice), link.
    assert_eq!(stats.inodes, 5, "{stats:?}");
    assert_eq!(stats.files, 2);
    assert_eq!(stats.dirs, 1);
    assert_eq!(stats.hard_links, 1);
    assert_eq!(stats.bytes, 400_000 + 11);
    // At an offset inside a bigger file, as in a SIF.
    let mut f = tempfile::tempfile().expect("temp file");
    f.write_all(&[0x55; 4096]).expect("pad");
    f.write_all(&img).expect("image");
    f.write_all(&[0xaa; 100]).expect("after");
    squash::verify_at(&f, 4096, img.len() as u64, 0).expect("at an offset");
}

#[test]
fn a_flipped_byte_in_a_compressed_data_block_is_refused() {
    let mut img = image();
    // The first data block follows the superblock (no compressor
    // options): a zlib stream.
    assert_eq!(img[96], 0x78, "a zlib header");
    img[96 + 200] ^= 0x40;
    let msg = corrupt(verify(&img));
    assert!(msg.contains("a-big.txt"), "{msg}");
}

#[test]
fn a_flipped_byte_in_the_inode_or_directory_table_is_refused() {
    let good = image();
    for (table, name) in [(INODE_TABLE, "inode"), (DIR_TABLE, "directory")] {
        let mut img = good.clone();
        let at = usize::try_from(u64_at(&img, table)).expect("offset");
        let head = u16::from_le_bytes([img[at], img[at + 1]]);
        assert_eq!(
            head & 0x8000,
            0,
            "the {name} table's first block is compressed"
        );
        img[at + 2 + 10] ^= 0x10;
        corrupt(verify(&img));
    }
}

#[test]
fn a_truncated_image_or_a_bytes_used_past_its_space_is_refused() {
    let img = image();
    for cut in [0, 50, 96, img.len() / 3, img.len() / 2, img.len() - 4097] {
        assert!(verify(&img[..cut]).is_err(), "cut at {cut}");
    }
    let used = usize::try_from(u64_at(&img, BYTES_USED)).expect("used");
    let msg = corrupt(verify(&img[..used - 1]));
    assert!(msg.contains("bytes_used"), "{msg}");
    // Exactly bytes_used (no 4 KiB padding) is enough.
    verify(&img[..used]).expect("exactly bytes_used");
}

#[test]
fn mksquashfs_images_pass() {
    if !have("mksquashfs") {
        return;
    }
    let t = tempfile::tempdir().expect("tempdir");
    let tree = t.path().join("tree");
    make_tree(&tree, 300);
    for comp in ["gzip", "zstd"] {
        let out = t.path().join(format!("{comp}.sqfs"));
        let st = Command::new("mksquashfs")
            .arg(&tree)
            .arg(&out)
            .args(["-comp", comp, "-noappend", "-quiet", "-no-progress"])
            .status()
            .expect("mksquashfs");
        assert!(st.success(), "mksquashfs -comp {comp}");
        let bytes = std::fs::read(&out).expect("read");
        let stats = verify(&bytes).unwrap_or_else(|e| panic!("{comp}: {e}"));
        assert!(stats.files >= 300, "{stats:?}");
        // Three names of one file (mksquashfs does not keep the symlink's
        // hard link that the tree also has).
        assert!(stats.hard_links >= 2, "{comp}: {stats:?}");
    }
}

fn unpacks(bytes: &[u8]) -> Result<(), SquashError> {
    let t = tempfile::tempdir().expect("tempdir");
    let p = t.path().join("img");
    std::fs::write(&p, bytes).expect("write");
    let f = File::open(&p).expect("open");
    let r = squash::unpack_at(
        &f,
        0,
        bytes.len() as u64,
        &t.path().join("out"),
        &UnpackOptions::for_caller(),
    )
    .map(drop);
    make_writable(&t.path().join("out"));
    r
}

/// Lets the temp dir go whatever modes the image gave.
fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random damage (bytes changed anywhere, the image cut short) never
    /// panics the verifier, and whatever it passes unpacks.
    #[test]
    fn damage_never_panics_and_what_passes_unpacks(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        in_metadata in any::<bool>(),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        level0 in any::<bool>(),
    ) {
        static IMAGES: std::sync::OnceLock<(Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
        let (packed, stored) = IMAGES.get_or_init(|| (image(), stored_image()));
        let mut img = if level0 { stored.clone() } else { packed.clone() };
        // Half the cases aim at the tables (after the data), where most
        // of the parsing is.
        let from = if in_metadata {
            usize::try_from(u64_at(&img, INODE_TABLE)).unwrap_or(0).min(img.len() - 1)
        } else {
            0
        };
        for (at, value) in &edits {
            let i = from + at.index(img.len() - from);
            img[i] = *value;
        }
        if let Some(cut) = cut {
            img.truncate(cut.index(img.len()));
        }
        if verify(&img).is_ok() {
            prop_assert!(unpacks(&img).is_ok(), "verified, but does not unpack");
        }
    }
}

/// The tree of [`image`] packed at level 0: every block stored, so that
/// damage reaches the parser rather than the decompressor.
fn stored_image() -> Vec<u8> {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d/e")).expect("mkdir");
    std::fs::write(src.join("d/small"), b"small file\n").expect("write");
    std::fs::write(src.join("d/e/two"), vec![7u8; 5000]).expect("write");
    std::fs::hard_link(src.join("d/small"), src.join("d/again")).expect("link");
    std::os::unix::fs::symlink("d/small", src.join("link")).expect("symlink");
    let out = t.path().join("x.sqfs");
    let opts = PackOptions {
        compression_level: 0,
        ..PackOptions::default()
    };
    squash::pack(&src, &out, &opts).expect("pack");
    std::fs::read(out).expect("read")
}
