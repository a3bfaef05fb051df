//! Feeds arbitrary bytes to squashfs extraction into a fresh temp dir.
//! Any error is fine; a panic, a hang or a write outside the dir is not.
//! Seed the corpus with small images (`sifbox` packs with level 0 store
//! metadata uncompressed, which lets mutations reach the parser).
#![no_main]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sifbox_image::squash::{unpack_at, UnpackOptions};

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
    let dest = tmp.path().join("dest");
    let _ = unpack_at(
        &file,
        0,
        data.len() as u64,
        &dest,
        &UnpackOptions::for_caller(),
    );
    let mut names: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read tmp")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert!(
        names.iter().all(|n| n == "dest" || n == "image"),
        "{names:?}"
    );
    unlock(&dest);
});
