//! Interop with real tools: an OCI layout built by `umoci` from a small
//! rootfs (plus a whiteout layer), imported as a layout, and as the
//! oci-archive and docker-archive that `skopeo` makes of it; compared with
//! what `umoci unpack` produces. Skips (loudly) when a tool is missing:
//! `apt-get install umoci skopeo`.

use crate::layer_util as util;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use sifbox_image::layer::{unpack_image, ImportOptions, SourceKind};
use util::{is_root, tree};

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `umoci SUBCOMMAND ARGS...`, rootless where that matters.
fn umoci(args: &[&str]) {
    let mut c = Command::new("umoci");
    c.arg(args[0]);
    if !is_root() && matches!(args[0], "insert" | "unpack") {
        c.arg("--rootless");
    }
    run(c.args(&args[1..]));
}

/// Paths with their file type and permission bits.
fn listing(root: &Path) -> Vec<(String, u32)> {
    tree(root)
        .into_iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(root.join(&p)).expect("stat");
            (p, m.mode())
        })
        .collect()
}

fn make_rootfs(root: &Path) {
    std::fs::create_dir_all(root.join("bin")).expect("bin");
    std::fs::create_dir_all(root.join("etc")).expect("etc");
    std::fs::create_dir_all(root.join("ro")).expect("ro");
    std::fs::create_dir_all(root.join("tmp")).expect("tmp");
    std::fs::write(root.join("bin/busybox"), b"BB").expect("busybox");
    std::fs::set_permissions(
        root.join("bin/busybox"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::hard_link(root.join("bin/busybox"), root.join("bin/sh")).expect("link");
    std::os::unix::fs::symlink("/bin/busybox", root.join("bin/ls")).expect("symlink");
    std::fs::write(root.join("bin/su"), b"su").expect("su");
    std::fs::set_permissions(root.join("bin/su"), std::fs::Permissions::from_mode(0o4755))
        .expect("chmod");
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod");
    std::fs::write(root.join("etc/motd"), b"hello").expect("motd");
    std::fs::write(root.join("etc/keep"), b"keep").expect("keep");
    std::fs::write(root.join("ro/f"), b"f").expect("ro/f");
    std::fs::set_permissions(root.join("ro"), std::fs::Permissions::from_mode(0o555))
        .expect("chmod");
}

#[test]
fn umoci_layout_and_skopeo_archives() {
    if !have("umoci") {
        eprintln!(
            "SKIP umoci_layout_and_skopeo_archives: umoci is not installed \
             (apt-get install umoci skopeo)"
        );
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let rootfs = t.join("rootfs");
    make_rootfs(&rootfs);
    let layout = t.join("layout");
    let image = format!("{}:t", layout.display());
    umoci(&["init", "--layout", layout.to_str().expect("utf-8")]);
    umoci(&["new", "--image", &image]);
    umoci(&[
        "insert",
        "--image",
        &image,
        rootfs.to_str().expect("utf-8"),
        "/",
    ]);
    umoci(&["insert", "--image", &image, "--whiteout", "/etc/motd"]);
    umoci(&[
        "config",
        "--image",
        &image,
        "--config.env",
        "FOO=bar",
        "--config.cmd",
        "/bin/sh",
        "--config.workingdir",
        "/srv",
        "--config.label",
        "org.example=yes",
    ]);

    let dest = t.join("from-layout");
    let u = unpack_image(&layout, &dest, &ImportOptions::default()).expect("import umoci layout");
    assert_eq!(u.kind, SourceKind::OciLayout);
    assert!(u.layers >= 2, "{} layers", u.layers);
    assert!(
        u.config.env.iter().any(|e| e == "FOO=bar"),
        "{:?}",
        u.config.env
    );
    assert_eq!(u.config.cmd, Some(vec!["/bin/sh".to_string()]));
    assert_eq!(u.config.workdir.as_deref(), Some("/srv"));
    assert_eq!(
        u.config.labels.get("org.example").map(String::as_str),
        Some("yes")
    );
    assert!(!dest.join("etc/motd").exists(), "whiteout not applied");
    assert_eq!(std::fs::read(dest.join("etc/keep")).expect("keep"), b"keep");
    assert_eq!(
        std::fs::read_link(dest.join("bin/ls")).expect("readlink"),
        Path::new("/bin/busybox")
    );
    let ino = |p: &str| std::fs::metadata(dest.join(p)).expect("stat").ino();
    assert_eq!(ino("bin/sh"), ino("bin/busybox"));
    assert_eq!(util::mode(&dest.join("bin/su")), 0o4755);
    assert_eq!(util::mode(&dest.join("tmp")), 0o1777);
    assert_eq!(util::mode(&dest.join("ro")), 0o555);

    // What umoci itself unpacks is the same tree, with the same modes.
    let bundle = t.join("bundle");
    umoci(&["unpack", "--image", &image, bundle.to_str().expect("utf-8")]);
    assert_eq!(listing(&dest), listing(&bundle.join("rootfs")));

    if !have("skopeo") {
        eprintln!("SKIP skopeo part of umoci_layout_and_skopeo_archives: skopeo is not installed");
        return;
    }
    let oci_archive = t.join("image.oci.tar");
    let docker_archive = t.join("image.docker.tar");
    run(Command::new("skopeo").args([
        "--insecure-policy",
        "copy",
        &format!("oci:{image}"),
        &format!("oci-archive:{}", oci_archive.display()),
    ]));
    run(Command::new("skopeo").args([
        "--insecure-policy",
        "copy",
        &format!("oci:{image}"),
        &format!("docker-archive:{}:example/img:t", docker_archive.display()),
    ]));
    for (archive, kind) in [
        (&oci_archive, SourceKind::OciArchive),
        (&docker_archive, SourceKind::DockerArchive),
    ] {
        let d = t.join(format!("from-{kind:?}"));
        let u = unpack_image(archive, &d, &ImportOptions::default())
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(u.kind, kind);
        assert_eq!(u.config.cmd, Some(vec!["/bin/sh".to_string()]), "{kind}");
        assert_eq!(listing(&d), listing(&dest), "{kind}");
    }
}
