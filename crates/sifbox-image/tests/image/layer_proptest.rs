//! Property tests: random bytes and mutated valid layers never make the
//! applier panic, and never change anything outside the target.

use crate::layer_util as util;

use proptest::prelude::*;
use sifbox_image::layer::ApplyOptions;
use util::{Layer, Sandbox};

/// A valid layer touching every code path: dirs, files, links, whiteouts,
/// opaque dirs, PAX records, long names, devices, fifos, odd modes.
fn base_layer() -> Vec<u8> {
    Layer::new()
        .dir("./", 0o755)
        .dir("etc/", 0o755)
        .file("etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .symlink("lib", "usr/lib")
        .dir("usr/lib/", 0o555)
        .file("lib/libc.so", 0o755, &[0x7f; 700])
        .hardlink("etc/passwd-", "etc/passwd")
        .whiteout("etc/.wh.shadow")
        .whiteout("usr/.wh..wh..opq")
        .pax(&[("path", b"pax/file"), ("SCHILY.xattr.user.a", b"1")])
        .file("x", 0o644, b"pax body")
        .file(&format!("{}/long", "d".repeat(110)), 0o4755, b"long")
        .fifo("run/fifo", 0o600)
        .device("dev/null", false, 1, 3, 0o666)
        .symlink("escape", "../canary")
        .file("tmp/f", 0o1777, b"")
        .tar()
}

fn apply_checked(bytes: &[u8]) {
    let sb = Sandbox::new();
    // Any result is fine; a panic or a change outside dest is not.
    let _ = sb.apply(bytes, &ApplyOptions::default());
    sb.assert_canary();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        apply_checked(&bytes);
    }

    #[test]
    fn random_blocks_after_a_valid_header_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut bytes = Layer::new().dir("a/", 0o755).tar();
        bytes.truncate(512);
        bytes.extend_from_slice(&tail);
        apply_checked(&bytes);
    }

    #[test]
    fn mutated_layers_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        compress in 0u8..3,
    ) {
        let mut bytes = base_layer();
        for (at, value) in &edits {
            let i = at.index(bytes.len());
            bytes[i] = *value;
        }
        if let Some(cut) = cut {
            let n = cut.index(bytes.len());
            bytes.truncate(n);
        }
        let bytes = match compress {
            0 => bytes,
            1 => util::gzip(&bytes),
            _ => zstd::encode_all(&bytes[..], 1).expect("zstd"),
        };
        apply_checked(&bytes);
    }

    #[test]
    fn mutated_compressed_streams_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        zstd_not_gzip in any::<bool>(),
    ) {
        let tar = base_layer();
        let mut bytes = if zstd_not_gzip {
            zstd::encode_all(&tar[..], 1).expect("zstd")
        } else {
            util::gzip(&tar)
        };
        for (at, value) in &edits {
            let i = at.index(bytes.len());
            bytes[i] = *value;
        }
        apply_checked(&bytes);
    }
}

#[test]
fn base_layer_applies_cleanly() {
    let sb = Sandbox::new();
    let report = sb
        .apply(&base_layer(), &ApplyOptions::default())
        .expect("valid");
    assert_eq!(report.devices.len(), 1);
    sb.assert_canary();
}
