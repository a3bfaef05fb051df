//! Feeds arbitrary bytes to the layer applier as a layer (plain, gzip or
//! zstd, told apart by the first bytes) extracted into a fresh temp dir.
//! Any error is fine; a panic, a hang or a write outside the dir is not.
#![no_main]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sifbox_image::layer::{apply_layer, ApplyOptions};

/// Gives the owner access everywhere so that the temp dir can be removed
/// after odd modes (matters when fuzzing unprivileged).
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
    let dest = tmp.path().join("dest");
    std::fs::create_dir(&dest).expect("dest");
    let dir = cap_std::fs::Dir::open_ambient_dir(&dest, cap_std::ambient_authority())
        .expect("open dest");
    let _ = apply_layer(data, &dir, &ApplyOptions::default());
    drop(dir);
    // Nothing may appear beside `dest`.
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read tmp")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, [std::ffi::OsString::from("dest")]);
    unlock(&dest);
});
