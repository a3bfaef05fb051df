//! Regression: files whose size is a multiple of the block size, and files
//! with holes, used to leak buffers of the packing pipeline until it
//! deadlocked (seen importing a tarball of 64 files of 256 KiB).

use std::path::Path;

use sifbox_image::squash::{self, PackOptions, UnpackOptions};

fn fill(seed: &mut u64, buf: &mut [u8]) {
    for b in buf.iter_mut() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *b = (*seed & 0xff) as u8;
    }
}

#[test]
fn block_multiple_and_sparse_files_round_trip() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let mut seed = 0x1234_5678_9abc_def1u64;
    let block = 128 * 1024;
    // More whole-block files than the pipeline has buffers in flight.
    for i in 0..64 {
        let mut data = vec![0u8; block * (1 + i % 3)];
        fill(&mut seed, &mut data);
        std::fs::write(src.join(format!("whole{i}")), &data).expect("write");
    }
    // Files with all-zero blocks (holes) between data.
    for i in 0..16 {
        let mut data = vec![0u8; block * 3 + 100];
        fill(&mut seed, &mut data[..block]);
        fill(&mut seed, &mut data[block * 2..block * 2 + 10]);
        std::fs::write(src.join(format!("holes{i}")), &data).expect("write");
    }
    let image = t.path().join("x.sqfs");
    squash::pack(&src, &image, &PackOptions::default()).expect("pack");
    let out = t.path().join("out");
    squash::unpack(&image, &out, &UnpackOptions::for_caller()).expect("unpack");
    for e in std::fs::read_dir(&src).expect("read_dir").flatten() {
        let name = e.file_name();
        let a = std::fs::read(e.path()).expect("read");
        let b = std::fs::read(Path::new(&out).join(&name)).expect("read back");
        assert!(a == b, "{name:?} differs after the round trip");
    }
}
