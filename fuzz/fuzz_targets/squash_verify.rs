//! Feeds arbitrary bytes to the squashfs check an import runs
//! (`verify_at`). Any error is fine; a panic or a hang is not, and an image
//! the check passes must unpack.
//! Seed the corpus as for `squash_unpack` (level-0 images from `sifbox`).
#![no_main]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sifbox_image::squash::{unpack_at, verify_at, UnpackOptions};

/// Gives the owner access everywhere so that the temp dir can be removed.
fn unlock(dir: &Path) {
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                unlock(&e.path());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let tmp = tempfile::tempdir().expect("tempdir");
    let image = tmp.path().join("image");
    std::fs::File::create(&image)
        .and_then(|mut f| f.write_all(data))
        .expect("image");
    let file = std::fs::File::open(&image).expect("open image");
    let len = data.len() as u64;
    if verify_at(&file, 0, len, 1).is_ok() {
        let dest = tmp.path().join("dest");
        let unpacked = unpack_at(&file, 0, len, &dest, &UnpackOptions::for_caller());
        unlock(&dest);
        assert!(
            unpacked.is_ok(),
            "verified but does not unpack: {unpacked:?}"
        );
    }
});
