//! Image sources: OCI layouts (one and two platforms, nested indexes),
//! oci-archives, docker-archives, rootfs tarballs; digest checks.

use crate::layer_util as util;

use std::path::Path;

use serde_json::json;
use sifbox_image::layer::{unpack_image, Error, ImportOptions, Platform, SourceKind};
use util::{gzip, sha256_hex, tree, Layer};

/// A layer as stored (maybe compressed) and its uncompressed tar.
struct Blob {
    stored: Vec<u8>,
    tar: Vec<u8>,
    media: &'static str,
}

fn plain(tar: Vec<u8>) -> Blob {
    Blob {
        stored: tar.clone(),
        tar,
        media: "application/vnd.oci.image.layer.v1.tar",
    }
}

fn gz(tar: Vec<u8>) -> Blob {
    Blob {
        stored: gzip(&tar),
        tar,
        media: "application/vnd.oci.image.layer.v1.tar+gzip",
    }
}

fn zst(tar: Vec<u8>) -> Blob {
    Blob {
        stored: zstd::encode_all(&tar[..], 3).expect("zstd"),
        tar,
        media: "application/vnd.oci.image.layer.v1.tar+zstd",
    }
}

fn write_blob(layout: &Path, data: &[u8]) -> serde_json::Value {
    let hex = sha256_hex(data);
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).expect("blobs dir");
    std::fs::write(dir.join(&hex), data).expect("blob");
    json!({"digest": format!("sha256:{hex}"), "size": data.len()})
}

fn config_json(arch: &str, diff_ids: &[String], cmd: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/bin:/bin", format!("ARCH={arch}")],
            "WorkingDir": "/work",
            "User": "1000:1000",
            "Entrypoint": ["/bin/entry"],
            "Cmd": [cmd],
            "Labels": {"org.example.arch": arch},
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .expect("json")
}

/// Writes an image (config + layers + manifest) into `layout`; returns the
/// manifest descriptor.
fn write_image(layout: &Path, arch: &str, layers: &[Blob]) -> serde_json::Value {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha256_hex(&l.tar)))
        .collect();
    let mut config = write_blob(layout, &config_json(arch, &diff_ids, arch));
    config["mediaType"] = json!("application/vnd.oci.image.config.v1+json");
    let descs: Vec<serde_json::Value> = layers
        .iter()
        .map(|l| {
            let mut d = write_blob(layout, &l.stored);
            d["mediaType"] = json!(l.media);
            d
        })
        .collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": descs,
    }))
    .expect("json");
    let mut d = write_blob(layout, &manifest);
    d["mediaType"] = json!("application/vnd.oci.image.manifest.v1+json");
    d["platform"] = json!({"os": "linux", "architecture": arch});
    d
}

fn write_index(layout: &Path, manifests: Vec<serde_json::Value>) {
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("oci-layout");
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests})).expect("json"),
    )
    .expect("index");
}

fn amd64_layers() -> Vec<Blob> {
    vec![
        gz(Layer::new()
            .dir("etc/", 0o755)
            .file("etc/os-release", 0o644, b"ID=test\n")
            .file("etc/old", 0o644, b"old")
            .dir("opt/app/", 0o755)
            .file("opt/app/stale", 0o644, b"s")
            .file("bin/busybox", 0o755, b"BB")
            .hardlink("bin/sh", "bin/busybox")
            .file("usr/bin/passwd", 0o4755, b"pw")
            .dir("tmp/", 0o1777)
            .device("dev/null", false, 1, 3, 0o666)
            .tar()),
        plain(
            Layer::new()
                .whiteout("etc/.wh.old")
                .whiteout("opt/app/.wh..wh..opq")
                .file("opt/app/fresh", 0o644, b"f")
                .file("arch", 0o644, b"amd64")
                .tar(),
        ),
    ]
}

fn arm64_layers() -> Vec<Blob> {
    vec![zst(Layer::new()
        .file("arch", 0o644, b"arm64")
        .symlink("bin/sh", "/bin/busybox")
        .tar())]
}

/// A layout with an amd64 and an arm64 image.
fn two_platform_layout(dir: &Path) {
    let a = write_image(dir, "amd64", &amd64_layers());
    let b = write_image(dir, "arm64", &arm64_layers());
    write_index(dir, vec![a, b]);
}

fn opts_for(platform: &str) -> ImportOptions {
    ImportOptions {
        platform: Some(platform.parse().expect("platform")),
        ..ImportOptions::default()
    }
}

fn assert_amd64_tree(dest: &Path) {
    assert_eq!(
        tree(dest),
        [
            "arch",
            "bin",
            "bin/busybox",
            "bin/sh",
            "dev",
            "dev/null",
            "etc",
            "etc/os-release",
            "opt",
            "opt/app",
            "opt/app/fresh",
            "tmp",
            "usr",
            "usr/bin",
            "usr/bin/passwd",
        ]
    );
    assert_eq!(std::fs::read(dest.join("arch")).expect("arch"), b"amd64");
    assert_eq!(util::mode(&dest.join("usr/bin/passwd")), 0o4755);
    assert_eq!(util::mode(&dest.join("tmp")), 0o1777);
}

#[test]
fn oci_layout_with_two_platforms() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layout = tmp.path().join("layout");
    two_platform_layout(&layout);

    let dest = tmp.path().join("amd64");
    let u = unpack_image(&layout, &dest, &opts_for("linux/amd64")).expect("amd64");
    assert_eq!(u.kind, SourceKind::OciLayout);
    assert_eq!(u.layers, 2);
    assert!(u.config_digest.is_some());
    assert_amd64_tree(&dest);
    assert_eq!(u.config.env, ["PATH=/usr/bin:/bin", "ARCH=amd64"]);
    assert_eq!(u.config.workdir.as_deref(), Some("/work"));
    assert_eq!(u.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(u.config.entrypoint, Some(vec!["/bin/entry".to_string()]));
    assert_eq!(u.config.cmd, Some(vec!["amd64".to_string()]));
    assert_eq!(
        u.config.labels.get("org.example.arch").map(String::as_str),
        Some("amd64")
    );
    assert_eq!(u.platform, Some("linux/amd64".parse().expect("platform")));
    assert_eq!(u.devices.len(), 1);
    assert_eq!(u.devices[0].path, "/dev/null");

    let dest = tmp.path().join("arm64");
    let u = unpack_image(&layout, &dest, &opts_for("linux/arm64/v8")).expect("arm64");
    assert_eq!(tree(&dest), ["arch", "bin", "bin/sh"]);
    assert_eq!(std::fs::read(dest.join("arch")).expect("arch"), b"arm64");
    assert_eq!(u.config.cmd, Some(vec!["arm64".to_string()]));

    // The host's platform by default.
    let host = Platform::host();
    if host.architecture == "amd64" || host.architecture == "arm64" {
        let dest = tmp.path().join("host");
        let u = unpack_image(&layout, &dest, &ImportOptions::default()).expect("host");
        assert_eq!(
            std::fs::read(dest.join("arch")).expect("arch"),
            host.architecture.as_bytes()
        );
        assert_eq!(u.platform.map(|p| p.architecture), Some(host.architecture));
    }

    let err = unpack_image(&layout, &tmp.path().join("s390x"), &opts_for("linux/s390x"))
        .expect_err("no such platform");
    let msg = err.to_string();
    assert!(msg.contains("linux/s390x"), "{msg}");
    assert!(
        msg.contains("linux/amd64") && msg.contains("linux/arm64"),
        "{msg}"
    );
}

#[test]
fn nested_index_and_reference_names() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layout = tmp.path().join("layout");
    let a = write_image(&layout, "amd64", &amd64_layers());
    let b = write_image(&layout, "arm64", &arm64_layers());
    let attestation = json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": a["digest"], "size": a["size"],
        "platform": {"os": "unknown", "architecture": "unknown"},
        "annotations": {"vnd.docker.reference.type": "attestation-manifest"},
    });
    let inner = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [attestation, a, b],
    }))
    .expect("json");
    let mut inner_desc = write_blob(&layout, &inner);
    inner_desc["mediaType"] = json!("application/vnd.oci.image.index.v1+json");
    inner_desc["annotations"] = json!({"org.opencontainers.image.ref.name": "multi"});
    let single = write_image(&layout, "arm64", &arm64_layers());
    let mut single = single;
    single["annotations"] = json!({"io.containerd.image.name": "docker.io/library/single:1"});
    write_index(&layout, vec![inner_desc, single]);

    let mut o = opts_for("linux/amd64");
    o.reference = Some("multi".into());
    let dest = tmp.path().join("multi");
    unpack_image(&layout, &dest, &o).expect("multi");
    assert_amd64_tree(&dest);

    // A single manifest by reference, and a reference that names nothing.
    let o = ImportOptions {
        reference: Some("single:1".into()),
        ..ImportOptions::default()
    };
    let dest = tmp.path().join("single");
    unpack_image(&layout, &dest, &o).expect("single");
    assert_eq!(std::fs::read(dest.join("arch")).expect("arch"), b"arm64");
    let o = ImportOptions {
        reference: Some("nope".into()),
        ..ImportOptions::default()
    };
    let err = unpack_image(&layout, &tmp.path().join("nope"), &o).expect_err("no such name");
    assert!(err.to_string().contains("multi"), "{err}");
}

#[test]
fn digest_mismatch_is_rejected_before_anything_is_applied() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layout = tmp.path().join("layout");
    let layers = amd64_layers();
    let second = format!("sha256:{}", sha256_hex(&layers[1].stored));
    let d = write_image(&layout, "amd64", &layers);
    write_index(&layout, vec![d]);
    // Flip one byte of the second layer: same size, other content.
    let path = layout.join("blobs/sha256").join(&second["sha256:".len()..]);
    let mut bytes = std::fs::read(&path).expect("blob");
    bytes[600] ^= 0x20;
    std::fs::write(&path, &bytes).expect("corrupt");
    let dest = tmp.path().join("dest");
    let err = unpack_image(&layout, &dest, &ImportOptions::default()).expect_err("mismatch");
    match &err {
        Error::DigestMismatch { blob, .. } => assert_eq!(blob, &second),
        other => panic!("wrong error: {other}"),
    }
    assert!(err.to_string().contains(&second), "{err}");
    assert!(
        !dest.exists() || tree(&dest).is_empty(),
        "nothing may be applied"
    );

    // A truncated blob is a size mismatch; a missing one names it too.
    std::fs::write(&path, &bytes[..100]).expect("truncate");
    let err = unpack_image(&layout, &dest, &ImportOptions::default()).expect_err("size");
    assert!(err.to_string().contains(&second), "{err}");
    std::fs::remove_file(&path).expect("remove");
    let err = unpack_image(&layout, &dest, &ImportOptions::default()).expect_err("missing");
    assert!(err.to_string().contains(&second), "{err}");
    assert!(!dest.exists() || tree(&dest).is_empty());
}

#[test]
fn corrupt_config_or_manifest_is_rejected() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layout = tmp.path().join("layout");
    let d = write_image(&layout, "arm64", &arm64_layers());
    write_index(&layout, vec![d.clone()]);
    let manifest_hex = d["digest"].as_str().expect("digest")["sha256:".len()..].to_string();
    let mpath = layout.join("blobs/sha256").join(&manifest_hex);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&mpath).expect("manifest")).expect("json");
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .expect("digest")
        .to_string();
    let cpath = layout
        .join("blobs/sha256")
        .join(&config_digest["sha256:".len()..]);
    let mut config = std::fs::read(&cpath).expect("config");
    let n = config.len();
    config[n - 2] = b' ';
    std::fs::write(&cpath, &config).expect("write");
    let err = unpack_image(&layout, &tmp.path().join("d"), &ImportOptions::default())
        .expect_err("config mismatch");
    assert!(err.to_string().contains(&config_digest), "{err}");
    // A layout whose index names a path-like digest.
    let mut bad = d;
    bad["digest"] = json!("sha256:../../../../etc/passwd");
    write_index(&layout, vec![bad]);
    let err = unpack_image(&layout, &tmp.path().join("d"), &ImportOptions::default())
        .expect_err("bad digest");
    assert!(err.to_string().contains("hex"), "{err}");
}

fn tar_dir(src: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", src).expect("tar dir");
    b.into_inner().expect("finish")
}

#[test]
fn oci_archive_plain_and_compressed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layout = tmp.path().join("layout");
    two_platform_layout(&layout);
    let archive = tar_dir(&layout);
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch");
    for (name, bytes) in [
        ("image.tar", archive.clone()),
        ("image.tar.gz", gzip(&archive)),
    ] {
        let file = tmp.path().join(name);
        std::fs::write(&file, &bytes).expect("archive");
        let dest = tmp.path().join(format!("dest-{name}"));
        let o = ImportOptions {
            tmp_dir: Some(scratch.clone()),
            ..opts_for("linux/amd64")
        };
        let u = unpack_image(&file, &dest, &o).expect("oci-archive");
        assert_eq!(u.kind, SourceKind::OciArchive);
        assert_amd64_tree(&dest);
        assert!(tree(&scratch).is_empty(), "scratch dir left behind");
    }
}

/// A `docker save` archive in the legacy layout: `<id>/layer.tar`,
/// `<config-hex>.json`, `manifest.json`, `repositories`.
fn docker_archive(dir: &Path, layers: &[Vec<u8>], tags: &[&str]) -> String {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha256_hex(l)))
        .collect();
    let config = config_json("amd64", &diff_ids, "docker");
    let config_name = format!("{}.json", sha256_hex(&config));
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join(&config_name), &config).expect("config");
    let mut paths = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let id = sha256_hex(format!("layer-{i}").as_bytes());
        std::fs::create_dir_all(dir.join(&id)).expect("layer dir");
        std::fs::write(dir.join(&id).join("layer.tar"), l).expect("layer");
        std::fs::write(dir.join(&id).join("VERSION"), b"1.0").expect("version");
        paths.push(format!("{id}/layer.tar"));
    }
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&json!([{"Config": config_name, "RepoTags": tags, "Layers": paths}]))
            .expect("json"),
    )
    .expect("manifest");
    std::fs::write(dir.join("repositories"), b"{}").expect("repositories");
    config_name
}

#[test]
fn docker_archive_legacy_layout() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layers = vec![
        Layer::new()
            .file("etc/motd", 0o644, b"hi")
            .file("etc/gone", 0o644, b"x")
            .hardlink("etc/motd.link", "etc/motd")
            .tar(),
        Layer::new()
            .whiteout("etc/.wh.gone")
            .file("new", 0o600, b"n")
            .tar(),
    ];
    let src = tmp.path().join("src");
    docker_archive(&src, &layers, &["example/app:1"]);
    let file = tmp.path().join("docker.tar");
    std::fs::write(&file, tar_dir(&src)).expect("archive");
    let dest = tmp.path().join("dest");
    let u = unpack_image(&file, &dest, &ImportOptions::default()).expect("docker-archive");
    assert_eq!(u.kind, SourceKind::DockerArchive);
    assert_eq!(u.layers, 2);
    assert_eq!(tree(&dest), ["etc", "etc/motd", "etc/motd.link", "new"]);
    assert_eq!(util::mode(&dest.join("new")), 0o600);
    assert_eq!(u.config.cmd, Some(vec!["docker".to_string()]));
    assert_eq!(u.config.workdir.as_deref(), Some("/work"));

    // Compressed as a whole, and selected by tag.
    let gz_file = tmp.path().join("docker.tar.gz");
    std::fs::write(&gz_file, gzip(&tar_dir(&src))).expect("archive");
    let o = ImportOptions {
        reference: Some("example/app:1".into()),
        ..ImportOptions::default()
    };
    let dest = tmp.path().join("dest-gz");
    unpack_image(&gz_file, &dest, &o).expect("gz docker-archive");
    assert_eq!(tree(&dest), ["etc", "etc/motd", "etc/motd.link", "new"]);
    let o = ImportOptions {
        reference: Some("other:2".into()),
        ..ImportOptions::default()
    };
    let err = unpack_image(&gz_file, &tmp.path().join("x"), &o).expect_err("no such tag");
    assert!(err.to_string().contains("example/app:1"), "{err}");
}

#[test]
fn docker_archive_layer_not_matching_diff_id() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layers = vec![Layer::new().file("a", 0o644, b"a").tar()];
    let src = tmp.path().join("src");
    docker_archive(&src, &layers, &["x:1"]);
    // Swap the layer for another one: the config's diff_id no longer fits.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("manifest.json")).expect("read"))
            .expect("json");
    let layer_path = manifest[0]["Layers"][0].as_str().expect("path").to_string();
    std::fs::write(
        src.join(&layer_path),
        Layer::new().file("evil", 0o644, b"e").tar(),
    )
    .expect("swap");
    let file = tmp.path().join("docker.tar");
    std::fs::write(&file, tar_dir(&src)).expect("archive");
    let dest = tmp.path().join("dest");
    let err = unpack_image(&file, &dest, &ImportOptions::default()).expect_err("mismatch");
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&layer_path), "{err}");
    assert!(!dest.exists() || tree(&dest).is_empty());
}

#[test]
fn rootfs_tarballs_plain_gzip_zstd() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rootfs = || {
        Layer::new()
            .dir("./", 0o755)
            .dir("./bin/", 0o755)
            .file("./bin/busybox", 0o755, b"BB")
            .symlink("./bin/sh", "busybox")
            .dir("./tmp/", 0o1777)
    };
    for (name, bytes) in [
        ("rootfs.tar", rootfs().tar()),
        ("rootfs.tar.gz", rootfs().gzip()),
        ("rootfs.tar.zst", rootfs().zstd()),
    ] {
        let file = tmp.path().join(name);
        std::fs::write(&file, &bytes).expect("write");
        let dest = tmp.path().join(format!("d-{name}"));
        let u = unpack_image(&file, &dest, &ImportOptions::default()).expect(name);
        assert_eq!(u.kind, SourceKind::RootfsTar, "{name}");
        assert_eq!(u.config, Default::default());
        assert_eq!(
            tree(&dest),
            ["bin", "bin/busybox", "bin/sh", "tmp"],
            "{name}"
        );
        assert_eq!(util::mode(&dest.join("tmp")), 0o1777);
    }
}

#[test]
fn sources_that_are_not_images() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("plain-dir");
    std::fs::create_dir(&dir).expect("dir");
    let err = unpack_image(&dir, &tmp.path().join("d"), &ImportOptions::default())
        .expect_err("plain dir");
    assert!(err.to_string().contains("oci-layout"), "{err}");
    let junk = tmp.path().join("junk.bin");
    std::fs::write(&junk, vec![0x42u8; 4096]).expect("junk");
    let err =
        unpack_image(&junk, &tmp.path().join("d"), &ImportOptions::default()).expect_err("junk");
    assert!(err.to_string().contains("junk.bin"), "{err}");
    let missing = tmp.path().join("missing.tar");
    let err = unpack_image(&missing, &tmp.path().join("d"), &ImportOptions::default())
        .expect_err("missing");
    assert!(err.to_string().contains("missing.tar"), "{err}");
    // An archive-looking tar without oci-layout or manifest.json is applied
    // as a rootfs.
    let odd = tmp.path().join("odd.tar");
    std::fs::write(&odd, Layer::new().file("repositories", 0o644, b"{}").tar()).expect("odd");
    let u =
        unpack_image(&odd, &tmp.path().join("odd"), &ImportOptions::default()).expect("as rootfs");
    assert_eq!(u.kind, SourceKind::RootfsTar);
    assert_eq!(tree(&tmp.path().join("odd")), ["repositories"]);
}

#[test]
fn hostile_layer_inside_an_image_names_layer_and_entry() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layout = tmp.path().join("layout");
    let d = write_image(
        &layout,
        "amd64",
        &[
            plain(Layer::new().file("ok", 0o644, b"ok").tar()),
            gz(Layer::new()
                .symlink("a", "/etc")
                .file("a/x", 0o644, b"x")
                .tar()),
        ],
    );
    write_index(&layout, vec![d]);
    let err = unpack_image(&layout, &tmp.path().join("d"), &ImportOptions::default())
        .expect_err("hostile");
    assert_eq!(err.entry(), Some("a/x"));
    let msg = err.to_string();
    assert!(msg.contains("layer 2 of 2"), "{msg}");
}

#[test]
fn hostile_entry_inside_an_archive() {
    let tmp = tempfile::tempdir().expect("tmp");
    let canary = tmp.path().join("canary");
    std::fs::create_dir(&canary).expect("canary");
    let archive = tmp.path().join("evil.tar");
    std::fs::write(
        &archive,
        Layer::new()
            .file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#)
            .symlink("blobs", "../canary")
            .file("blobs/sha256", 0o644, b"x")
            .tar(),
    )
    .expect("archive");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch");
    let o = ImportOptions {
        tmp_dir: Some(scratch.clone()),
        ..ImportOptions::default()
    };
    let err = unpack_image(&archive, &tmp.path().join("d"), &o).expect_err("hostile");
    assert_eq!(err.entry(), Some("blobs/sha256"), "{err}");
    assert!(err.to_string().contains("evil.tar"), "{err}");
    assert!(tree(&canary).is_empty());
    assert!(tree(&scratch).is_empty(), "scratch dir left behind");
}
