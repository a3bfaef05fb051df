//! Applying layers: whiteouts, links, modes, devices, owners, compression,
//! and hostile entries that must not escape the target.

use crate::layer_util as util;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use sifbox_image::layer::{ApplyOptions, Devices, Error, Owners};
use util::{is_root, mode, tree, Layer, Sandbox, MTIME};

fn opts() -> ApplyOptions {
    ApplyOptions::default()
}

#[test]
fn files_dirs_and_mtimes() {
    let sb = Sandbox::new();
    let layer = Layer::new()
        .dir("./", 0o755)
        .dir("./etc/", 0o755)
        .file("./etc/hostname", 0o644, b"box\n")
        .file("usr/local/bin/tool", 0o755, b"#!/bin/sh\n") // parents implied
        .tar();
    let report = sb.apply(&layer, &opts()).expect("applies");
    assert_eq!(report.entries, 4);
    let d = sb.dest();
    assert_eq!(
        std::fs::read(d.join("etc/hostname")).expect("read"),
        b"box\n"
    );
    assert_eq!(mode(&d.join("usr/local/bin/tool")), 0o755);
    assert_eq!(mode(&d.join("usr/local")), 0o755);
    let mtime = |p: &str| std::fs::symlink_metadata(d.join(p)).expect("stat").mtime();
    assert_eq!(mtime("etc/hostname"), MTIME as i64);
    // A directory's mtime is set after its children are written.
    assert_eq!(mtime("etc"), MTIME as i64);
    assert_eq!(mtime("."), MTIME as i64);
    sb.assert_canary();
}

#[test]
fn whiteouts_and_opaque_dirs_across_layers() {
    let sb = Sandbox::new();
    let lower = Layer::new()
        .dir("etc/", 0o755)
        .file("etc/a", 0o644, b"a")
        .file("etc/b", 0o644, b"b")
        .dir("opq/", 0o755)
        .file("opq/x", 0o644, b"x")
        .dir("opq/sub/", 0o755)
        .file("opq/sub/y", 0o644, b"y")
        .dir("gone/", 0o755)
        .file("gone/z", 0o644, b"z")
        .file("file-then-dir", 0o644, b"f")
        .tar();
    sb.apply(&lower, &opts()).expect("lower");
    // The opaque marker comes after an entry of the same layer in `opq/`:
    // order inside a layer must not matter.
    let upper = Layer::new()
        .whiteout("etc/.wh.a")
        .whiteout(".wh.gone")
        .file("opq/new", 0o644, b"new")
        .dir("opq/sub/", 0o755)
        .file("opq/sub/y2", 0o644, b"y2")
        .whiteout("opq/.wh..wh..opq")
        // A whiteout never removes what its own layer adds...
        .file("etc/c", 0o644, b"c")
        .whiteout("etc/.wh.c")
        // ...in either order.
        .whiteout("etc/.wh.d")
        .file("etc/d", 0o644, b"d")
        // A whiteout of something absent is fine; aufs metadata is ignored.
        .whiteout("etc/.wh.never-there")
        .whiteout(".wh..wh.plnk")
        .dir("file-then-dir/", 0o755)
        .tar();
    sb.apply(&upper, &opts()).expect("upper");
    assert_eq!(
        tree(&sb.dest()),
        [
            "etc",
            "etc/b",
            "etc/c",
            "etc/d",
            "file-then-dir",
            "opq",
            "opq/new",
            "opq/sub",
            "opq/sub/y2",
        ]
    );
    sb.assert_canary();
}

#[test]
fn opaque_marker_first_keeps_later_entries() {
    let sb = Sandbox::new();
    sb.apply(&Layer::new().file("d/old", 0o644, b"o").tar(), &opts())
        .expect("lower");
    sb.apply(
        &Layer::new()
            .whiteout("d/.wh..wh..opq")
            .file("d/new", 0o644, b"n")
            .tar(),
        &opts(),
    )
    .expect("upper");
    assert_eq!(tree(&sb.dest()), ["d", "d/new"]);
}

#[test]
fn hard_links_within_and_across_layers() {
    let sb = Sandbox::new();
    sb.apply(
        &Layer::new()
            .file("bin/busybox", 0o755, b"BB")
            .hardlink("bin/sh", "bin/busybox")
            .hardlink("./bin/ls", "./bin/../bin/busybox")
            .tar(),
        &opts(),
    )
    .expect("lower");
    sb.apply(
        &Layer::new().hardlink("usr/bin/env", "bin/busybox").tar(),
        &opts(),
    )
    .expect("upper");
    let ino = |p: &str| {
        std::fs::symlink_metadata(sb.dest().join(p))
            .expect("stat")
            .ino()
    };
    let i = ino("bin/busybox");
    assert_eq!(ino("bin/sh"), i);
    assert_eq!(ino("bin/ls"), i);
    assert_eq!(ino("usr/bin/env"), i);
    assert_eq!(
        std::fs::symlink_metadata(sb.dest().join("bin/busybox"))
            .expect("stat")
            .nlink(),
        4
    );
    // Replacing one name of a hard-linked file does not change the others.
    sb.apply(&Layer::new().file("bin/sh", 0o755, b"new").tar(), &opts())
        .expect("replace");
    assert_eq!(
        std::fs::read(sb.dest().join("bin/busybox")).expect("read"),
        b"BB"
    );
    assert_eq!(
        std::fs::read(sb.dest().join("bin/sh")).expect("read"),
        b"new"
    );
}

#[test]
fn symlink_targets_are_kept_verbatim_and_never_followed() {
    let sb = Sandbox::new();
    let canary_file = sb.canary().join("keep");
    sb.apply(
        &Layer::new()
            .symlink("abs", "/etc/passwd")
            .symlink("rel", "../../../../x")
            .symlink("dangling", "nowhere")
            .symlink("to-canary", canary_file.to_str().expect("utf-8"))
            .symlink("dir/link", "..")
            .tar(),
        &opts(),
    )
    .expect("applies");
    let target = |p: &str| std::fs::read_link(sb.dest().join(p)).expect("readlink");
    assert_eq!(target("abs").to_str(), Some("/etc/passwd"));
    assert_eq!(target("rel").to_str(), Some("../../../../x"));
    assert_eq!(target("dangling").to_str(), Some("nowhere"));
    assert_eq!(target("dir/link").to_str(), Some(".."));
    // A later file over a symlink replaces the link, never writes through it.
    sb.apply(
        &Layer::new()
            .file("to-canary", 0o644, b"overwritten?")
            .dir("abs/", 0o755)
            .tar(),
        &opts(),
    )
    .expect("replaces");
    assert!(std::fs::symlink_metadata(sb.dest().join("to-canary"))
        .expect("stat")
        .is_file());
    assert!(std::fs::symlink_metadata(sb.dest().join("abs"))
        .expect("stat")
        .is_dir());
    sb.assert_canary();
}

#[test]
fn parents_through_symlinks_inside_the_tree_are_followed() {
    let sb = Sandbox::new();
    sb.apply(
        &Layer::new()
            .dir("usr/lib/", 0o755)
            .symlink("lib", "usr/lib")
            .file("lib/libc.so", 0o644, b"c")
            .dir("a/b/", 0o755)
            .symlink("a/b/up", "../..")
            .file("a/b/up/top", 0o644, b"t")
            .tar(),
        &opts(),
    )
    .expect("applies");
    assert_eq!(
        std::fs::read(sb.dest().join("usr/lib/libc.so")).expect("read"),
        b"c"
    );
    assert_eq!(std::fs::read(sb.dest().join("top")).expect("read"), b"t");
    sb.assert_canary();
}

#[test]
fn special_modes_are_kept() {
    let sb = Sandbox::new();
    sb.apply(
        &Layer::new()
            .file("bin/su", 0o4755, b"su")
            .file("bin/wall", 0o2755, b"wall")
            .dir("tmp/", 0o1777)
            .file("private", 0o600, b"p")
            .tar(),
        &opts(),
    )
    .expect("applies");
    let d = sb.dest();
    assert_eq!(mode(&d.join("bin/su")), 0o4755);
    assert_eq!(mode(&d.join("bin/wall")), 0o2755);
    assert_eq!(mode(&d.join("tmp")), 0o1777);
    assert_eq!(mode(&d.join("private")), 0o600);
}

#[test]
fn read_only_dirs_still_get_their_files() {
    let sb = Sandbox::new();
    sb.apply(
        &Layer::new()
            .dir("ro/", 0o555)
            .file("ro/f", 0o444, b"f")
            .dir("ro/sub/", 0o500)
            .file("ro/sub/g", 0o400, b"g")
            .tar(),
        &opts(),
    )
    .expect("lower");
    let d = sb.dest();
    assert_eq!(mode(&d.join("ro")), 0o555);
    assert_eq!(mode(&d.join("ro/sub")), 0o500);
    // A later layer adds to and removes from the read-only dirs; their modes
    // stay as the lower layer set them.
    sb.apply(
        &Layer::new()
            .file("ro/new", 0o644, b"n")
            .whiteout("ro/.wh.f")
            .file("ro/sub/h", 0o644, b"h")
            .tar(),
        &opts(),
    )
    .expect("upper");
    assert_eq!(tree(&d), ["ro", "ro/new", "ro/sub", "ro/sub/g", "ro/sub/h"]);
    assert_eq!(mode(&d.join("ro")), 0o555);
    assert_eq!(mode(&d.join("ro/sub")), 0o500);
    // Directories without read or write permission for their owner can
    // still be merged into, made opaque and removed.
    sb.apply(
        &Layer::new()
            .dir("locked/", 0o311)
            .dir("locked/in/", 0o000)
            .file("locked/f", 0o000, b"")
            .tar(),
        &opts(),
    )
    .expect("locked");
    assert_eq!(mode(&d.join("locked")), 0o311);
    sb.apply(
        &Layer::new()
            .whiteout("locked/.wh..wh..opq")
            .file("locked/g", 0o644, b"g")
            .tar(),
        &opts(),
    )
    .expect("opaque locked");
    assert_eq!(mode(&d.join("locked")), 0o311);
    // A parent that loses its search permission in the same layer as its
    // loosened child is written.
    sb.apply(
        &Layer::new().dir("p/", 0o755).dir("p/c/", 0o555).tar(),
        &opts(),
    )
    .expect("p");
    sb.apply(
        &Layer::new()
            .dir("p/", 0o000)
            .file("p/c/f", 0o644, b"f")
            .tar(),
        &opts(),
    )
    .expect("p/c/f");
    assert_eq!(mode(&d.join("p")), 0o000);
    std::fs::set_permissions(d.join("p"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(mode(&d.join("p/c")), 0o555);
    sb.apply(&Layer::new().whiteout(".wh.p").tar(), &opts())
        .expect("remove p");
    // A layer that only restates a locked directory still sets its mode.
    sb.apply(&Layer::new().dir("locked/", 0o300).tar(), &opts())
        .expect("restate locked");
    assert_eq!(mode(&d.join("locked")), 0o300);
    sb.apply(&Layer::new().whiteout(".wh.locked").tar(), &opts())
        .expect("remove locked");
    // Whiting out a whole read-only tree works too.
    sb.apply(&Layer::new().whiteout(".wh.ro").tar(), &opts())
        .expect("whiteout");
    assert!(tree(&d).is_empty());
}

#[test]
fn fifos_and_device_placeholders() {
    let sb = Sandbox::new();
    let report = sb
        .apply(
            &Layer::new()
                .fifo("run/fifo", 0o620)
                .device("dev/null", false, 1, 3, 0o666)
                .device("dev/sda", true, 8, 0, 0o660)
                .tar(),
            &opts(),
        )
        .expect("applies");
    let d = sb.dest();
    let meta = std::fs::symlink_metadata(d.join("run/fifo")).expect("stat");
    assert!(meta.file_type().is_fifo());
    assert_eq!(meta.mode() & 0o7777, 0o620);
    let null = std::fs::symlink_metadata(d.join("dev/null")).expect("stat");
    assert!(null.is_file(), "placeholder is a regular file");
    assert_eq!(null.len(), 0);
    assert_eq!(null.mode() & 0o7777, 0o666);
    assert_eq!(report.devices.len(), 2);
    assert_eq!(report.devices[0].path, "/dev/null");
    assert_eq!((report.devices[0].major, report.devices[0].minor), (1, 3));
    assert_eq!(
        report.devices[1].kind,
        sifbox_image::layer::DeviceKind::Block
    );
    assert_eq!(report.devices[1].mode, 0o660);
}

#[test]
fn real_device_nodes_when_privileged() {
    if !is_root() {
        eprintln!("SKIP real_device_nodes_when_privileged: needs root");
        return;
    }
    let sb = Sandbox::new();
    let o = ApplyOptions {
        devices: Devices::Create,
        ..ApplyOptions::default()
    };
    match sb.apply(&Layer::new().device("null", false, 1, 3, 0o666).tar(), &o) {
        Ok(report) => {
            let meta = std::fs::symlink_metadata(sb.dest().join("null")).expect("stat");
            assert!(meta.file_type().is_char_device());
            assert_eq!(report.devices.len(), 1);
        }
        // Root without CAP_MKNOD (some containers): an error naming the entry.
        Err(e) => assert_eq!(e.entry(), Some("null"), "{e}"),
    }
}

#[test]
fn owners_keep_and_caller() {
    let layer = Layer::new()
        .owner(1234, 4321)
        .dir("home/u/", 0o750)
        .file("home/u/f", 0o640, b"x")
        .symlink("home/u/l", "f")
        .tar();
    let sb = Sandbox::new();
    sb.apply(&layer, &opts()).expect("caller");
    let me = rustix::process::geteuid().as_raw();
    let uid = |sb: &Sandbox, p: &str| {
        let m = std::fs::symlink_metadata(sb.dest().join(p)).expect("stat");
        (m.uid(), m.gid())
    };
    assert_eq!(uid(&sb, "home/u/f").0, me);
    let sb = Sandbox::new();
    let keep = ApplyOptions {
        owners: Owners::Keep,
        ..ApplyOptions::default()
    };
    let res = sb.apply(&layer, &keep);
    if is_root() {
        res.expect("keep as root");
        assert_eq!(uid(&sb, "home/u/f"), (1234, 4321));
        assert_eq!(uid(&sb, "home/u/l"), (1234, 4321));
        assert_eq!(uid(&sb, "home/u"), (1234, 4321));
        assert_eq!(mode(&sb.dest().join("home/u")), 0o750);
    } else {
        let e = res.expect_err("chown needs privilege");
        assert!(e.to_string().contains("owner"), "{e}");
    }
}

#[test]
fn setuid_survives_keep_owners() {
    if !is_root() {
        eprintln!("SKIP setuid_survives_keep_owners: needs root");
        return;
    }
    let sb = Sandbox::new();
    let keep = ApplyOptions {
        owners: Owners::Keep,
        ..ApplyOptions::default()
    };
    sb.apply(
        &Layer::new().owner(0, 0).file("su", 0o4755, b"x").tar(),
        &keep,
    )
    .expect("applies");
    assert_eq!(mode(&sb.dest().join("su")), 0o4755);
}

#[test]
fn user_xattrs_when_asked() {
    let layer = Layer::new()
        .pax(&[
            ("SCHILY.xattr.user.sifbox", b"v1"),
            ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
        ])
        .file("f", 0o644, b"x")
        .tar();
    let sb = Sandbox::new();
    sb.apply(&layer, &opts()).expect("without xattrs");
    let get = |sb: &Sandbox, name: &str| {
        let mut buf = [0u8; 64];
        rustix::fs::getxattr(sb.dest().join("f").as_path(), name, &mut buf[..])
            .map(|n| buf[..n].to_vec())
    };
    assert!(get(&sb, "user.sifbox").is_err());
    let sb = Sandbox::new();
    let with = ApplyOptions {
        xattrs: true,
        ..ApplyOptions::default()
    };
    sb.apply(&layer, &with).expect("with xattrs");
    match get(&sb, "user.sifbox") {
        Ok(v) => assert_eq!(v, b"v1"),
        Err(rustix::io::Errno::NOTSUP) => eprintln!("user xattrs not supported here"),
        Err(e) => panic!("getxattr: {e}"),
    }
    assert!(
        get(&sb, "trusted.overlay.opaque").is_err(),
        "trusted.* is never applied"
    );
}

#[test]
fn long_names_and_pax_paths() {
    let long = format!("{}/{}", "d".repeat(120), "f".repeat(150));
    let sb = Sandbox::new();
    sb.apply(
        &Layer::new()
            .file(&long, 0o644, b"long")
            .pax(&[("path", b"pax/named/file"), ("mtime", b"1234567890.5")])
            .file("ignored-name", 0o644, b"pax")
            .tar(),
        &opts(),
    )
    .expect("applies");
    assert_eq!(std::fs::read(sb.dest().join(&long)).expect("read"), b"long");
    let p = sb.dest().join("pax/named/file");
    assert_eq!(std::fs::read(&p).expect("read"), b"pax");
    assert_eq!(std::fs::metadata(&p).expect("stat").mtime(), 1_234_567_890);
    assert!(!sb.dest().join("ignored-name").exists());
}

#[test]
fn gzip_and_zstd_layers() {
    for (name, bytes) in [
        ("gzip", Layer::new().file("a/f", 0o644, b"gz").gzip()),
        ("zstd", Layer::new().file("a/f", 0o644, b"gz").zstd()),
    ] {
        let sb = Sandbox::new();
        sb.apply(&bytes, &opts())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(std::fs::read(sb.dest().join("a/f")).expect("read"), b"gz");
    }
}

/// Applies `layer`, expects a rejection naming `entry`, and checks that
/// nothing outside dest changed.
fn expect_rejected(sb: &Sandbox, layer: &[u8], entry: &str) -> Error {
    let err = sb.apply(layer, &opts()).expect_err("must be rejected");
    assert_eq!(err.entry(), Some(entry), "wrong entry named: {err}");
    assert!(
        err.to_string().contains(entry),
        "message must name the entry: {err}"
    );
    sb.assert_canary();
    err
}

#[test]
fn hostile_dotdot_and_absolute_names() {
    let sb = Sandbox::new();
    let e = expect_rejected(&sb, &Layer::new().file("../x", 0o644, b"x").tar(), "../x");
    assert!(matches!(e, Error::Rejected { .. }), "{e}");
    expect_rejected(
        &sb,
        &Layer::new().file("../canary/keep", 0o644, b"x").tar(),
        "../canary/keep",
    );
    expect_rejected(
        &sb,
        &Layer::new().file("a/../../canary/new", 0o644, b"x").tar(),
        "a/../../canary/new",
    );
    let abs = format!("{}/new", sb.canary().display());
    expect_rejected(&sb, &Layer::new().file(&abs, 0o644, b"x").tar(), &abs);
    expect_rejected(&sb, &Layer::new().dir("/abs/", 0o755).tar(), "/abs/");
    expect_rejected(&sb, &Layer::new().symlink("../l", "x").tar(), "../l");
}

#[test]
fn hostile_writes_through_symlinks() {
    let sb = Sandbox::new();
    let canary = sb.canary();
    let canary = canary.to_str().expect("utf-8");
    // a -> /etc, then a/<file>: never written (a unique name, to be safe).
    let probe = format!("sifbox-escape-probe-{}", std::process::id());
    let e = expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "/etc")
            .file(&format!("a/{probe}"), 0o644, b"x")
            .tar(),
        &format!("a/{probe}"),
    );
    assert!(e.to_string().contains("outside"), "{e}");
    assert!(!std::path::Path::new("/etc").join(&probe).exists());
    // Absolute symlink to the canary, then a file below it.
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("c", canary)
            .file("c/keep", 0o644, b"x")
            .tar(),
        "c/keep",
    );
    // a -> ../.. then a/x, and a -> ../canary then a/keep.
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "../..")
            .file("a/x", 0o644, b"x")
            .tar(),
        "a/x",
    );
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "../canary")
            .file("a/keep", 0o644, b"x")
            .tar(),
        "a/keep",
    );
    // The same through a directory entry, a symlink entry and a hard link.
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "../canary")
            .dir("a/sub/", 0o755)
            .tar(),
        "a/sub/",
    );
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "../canary")
            .symlink("a/l", "x")
            .tar(),
        "a/l",
    );
    // A symlink chain that ends outside.
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("one", "two")
            .symlink("two", "../canary")
            .file("one/keep", 0o644, b"x")
            .tar(),
        "one/keep",
    );
    // Whiteouts through an escaping symlink.
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "../canary")
            .whiteout("a/.wh.keep")
            .tar(),
        "a/.wh.keep",
    );
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "../canary")
            .whiteout("a/.wh..wh..opq")
            .tar(),
        "a/.wh..wh..opq",
    );
}

#[test]
fn hostile_hard_links() {
    let sb = Sandbox::new();
    expect_rejected(
        &sb,
        &Layer::new().hardlink("x", "../../etc/passwd").tar(),
        "x",
    );
    expect_rejected(&sb, &Layer::new().hardlink("x", "/etc/passwd").tar(), "x");
    expect_rejected(
        &sb,
        &Layer::new()
            .symlink("a", "../canary")
            .hardlink("x", "a/keep")
            .tar(),
        "x",
    );
    // A hard link to a symlink links the symlink itself, not its target.
    let sb = Sandbox::new();
    sb.apply(
        &Layer::new()
            .symlink("s", "../canary/keep")
            .hardlink("h", "s")
            .tar(),
        &opts(),
    )
    .expect("link to a symlink");
    assert!(std::fs::symlink_metadata(sb.dest().join("h"))
        .expect("stat")
        .file_type()
        .is_symlink());
    let sb = Sandbox::new();
    expect_rejected(&sb, &Layer::new().hardlink("x", "missing").tar(), "x");
    expect_rejected(
        &sb,
        &Layer::new().dir("d/", 0o755).hardlink("x", "d").tar(),
        "x",
    );
}

#[test]
fn hostile_whiteouts() {
    let sb = Sandbox::new();
    for name in ["d/.wh...", ".wh...", ".wh..", "d/.wh."] {
        let e = expect_rejected(
            &sb,
            &Layer::new().dir("d/", 0o755).whiteout(name).tar(),
            name,
        );
        assert!(matches!(e, Error::Rejected { .. }), "{e}");
    }
    expect_rejected(
        &sb,
        &Layer::new().whiteout("../.wh.canary").tar(),
        "../.wh.canary",
    );
    assert!(sb.canary().join("keep").exists());
}

#[test]
fn malformed_streams_give_errors() {
    let sb = Sandbox::new();
    // Not a tar at all.
    let e = sb.apply(&[7u8; 1024], &opts()).expect_err("garbage");
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
    // Truncated inside a body.
    let mut t = Layer::new().file("f", 0o644, &[1u8; 4000]).tar();
    t.truncate(2048);
    let e = sb.apply(&t, &opts()).expect_err("truncated");
    assert!(e.to_string().contains('f'), "{e}");
    // An absurd size in an otherwise valid header.
    let mut h = tar::Header::new_gnu();
    h.set_path("big").expect("path");
    h.set_size(u64::MAX >> 2);
    h.set_cksum();
    let e = sb
        .apply(&h.as_bytes()[..], &opts())
        .expect_err("absurd size");
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
    // A PAX size at the very top of the range.
    let t = Layer::new()
        .pax(&[("size", b"18446744073709551615")])
        .file("huge", 0o644, b"")
        .tar();
    let e = sb.apply(&t, &opts()).expect_err("pax size");
    assert!(e.to_string().contains("huge"), "{e}");
    let t = Layer::new()
        .pax(&[("size", b"18446744073709551615")])
        .whiteout(".wh.skipped-body")
        .tar();
    let e = sb.apply(&t, &opts()).expect_err("pax size, body skipped");
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
    // Unsupported compression and entry kinds.
    let e = sb
        .apply(&[0xfd, b'7', b'z', b'X', b'Z', 0, 0, 0], &opts())
        .expect_err("xz");
    assert!(e.to_string().contains("xz"), "{e}");
    let e = sb
        .apply(
            &Layer::new()
                .raw(tar::EntryType::GNUSparse, b"sparse", 0o644, b"", b"")
                .tar(),
            &opts(),
        )
        .expect_err("sparse");
    assert_eq!(e.entry(), Some("sparse"));
    sb.assert_canary();
}
