//! End-to-end tests of images (issue 3): importing, the store, exporting,
//! running images by name, digest and file, interop with Debian's siftool
//! and squashfs-tools, concurrency and crashes of importers.
//!
//! Each test has its own `$SIFBOX_CACHE` and `$SIFBOX_RUNTIME`. Tests that
//! need siftool or mksquashfs say so and fail when they are missing: CI
//! installs them (scripts/install-deps.sh).

#[path = "e2e/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::{rootfs, tempdir, Output, Sifbox};
use serde_json::Value;

/// A test's store plus its runtime dir.
struct Env {
    sb: Sifbox,
    cache: tempfile::TempDir,
    scratch: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            sb: Sifbox::new(),
            cache: tempdir("sifbox-e2e-cache."),
            scratch: tempdir("sifbox-e2e-img."),
        }
    }

    fn sifbox(&self, args: &[&str]) -> Output {
        self.sb
            .cmd(args)
            .env("SIFBOX_CACHE", self.cache.path())
            .output()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }

    /// A gzipped tarball of the test rootfs.
    fn rootfs_tarball(&self) -> PathBuf {
        let out = self.path("rootfs.tar.gz");
        run_tool(
            Command::new("tar")
                .arg("-C")
                .arg(rootfs())
                .arg("-czf")
                .arg(&out)
                .arg("."),
        );
        out
    }

    /// Images stored (files under images/).
    fn stored(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.cache.path().join("images"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn tmp_entries(&self) -> Vec<String> {
        std::fs::read_dir(self.cache.path().join("tmp"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn run_tool(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn require(tool: &str) -> PathBuf {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{tool} is missing: run scripts/install-deps.sh"))
}

fn digest_of(out: &Output) -> String {
    let d = out.stdout.trim().to_string();
    assert!(d.starts_with("sha256:") && d.len() == 71, "digest: {d:?}");
    d
}

#[test]
fn import_run_tag_export_remove() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let out = env.sifbox(&[
        "image",
        "import",
        tarball.to_str().unwrap_or_default(),
        "--name",
        "bb:1",
    ]);
    out.success();
    let digest = digest_of(&out);

    let ls = env.sifbox(&["image", "ls", "--json"]);
    ls.success();
    let ls: Value = ls.json();
    assert_eq!(ls["images"][0]["digest"], digest.as_str());
    assert_eq!(ls["images"][0]["refs"][0], "bb:1");

    // By name, by digest, by digest prefix.
    for r in ["bb:1", digest.as_str(), &digest[7..19]] {
        let out = env.sifbox(&["run", r, "cat", "/etc/sifbox-test-rootfs"]);
        out.success();
        assert_eq!(out.stdout, "sifbox-test-rootfs v1\n", "run {r}");
    }
    // Apptainer's layout is inside.
    let out = env.sifbox(&["run", "bb:1", "ls", "/.singularity.d/env"]);
    out.success();
    assert!(
        out.stdout.contains("10-docker2singularity.sh"),
        "{}",
        out.stdout
    );

    env.sifbox(&["image", "tag", "bb:1", "other/name:2"])
        .success();
    let inspect: Value = env
        .sifbox(&["image", "inspect", "other/name:2", "--json"])
        .json();
    assert_eq!(inspect["image"]["digest"], digest.as_str());

    // Export: a SIF file that runs and re-imports to the same digest.
    let sif = env.path("out.sif");
    env.sifbox(&["image", "export", "bb:1", sif.to_str().unwrap_or_default()])
        .success();
    let again = env.sifbox(&["image", "import", sif.to_str().unwrap_or_default()]);
    again.success();
    assert_eq!(digest_of(&again), digest);
    let out = env.sifbox(&["run", sif.to_str().unwrap_or_default(), "true"]);
    out.success();
    assert_eq!(env.stored().len(), 1, "one stored copy: {:?}", env.stored());

    // Removing one name keeps the image; the last one removes it.
    env.sifbox(&["image", "rm", "bb:1"]).success();
    env.sifbox(&["run", "other/name:2", "true"]).success();
    env.sifbox(&["image", "rm", "other/name:2"]).success();
    assert!(env.stored().is_empty(), "{:?}", env.stored());
    let out = env.sifbox(&["run", "bb:1", "true"]);
    out.sifbox_error();
}

#[test]
fn identical_inputs_give_identical_sifs() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let t = tarball.to_str().unwrap_or_default();
    let d1 = digest_of(&env.sifbox(&["image", "import", t]));
    // Another store, the same input: the same bytes.
    let other = Env::new();
    let d2 = digest_of(&other.sifbox(&["image", "import", t]));
    assert_eq!(d1, d2);
    // A rootfs directory imports deterministically too.
    let r = rootfs().to_str().unwrap_or_default().to_string();
    let dir_sif = env.path("dir.sif");
    let d3 = digest_of(&env.sifbox(&["image", "import", &r, "--name", "dir:1"]));
    env.sifbox(&[
        "image",
        "export",
        "dir:1",
        dir_sif.to_str().unwrap_or_default(),
    ])
    .success();
    let d4 = digest_of(&other.sifbox(&["image", "import", &r]));
    assert_eq!(d3, d4);
}

#[test]
fn siftool_reads_what_sifbox_writes() {
    let siftool = require("siftool");
    let unsquashfs = require("unsquashfs");
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    env.sifbox(&[
        "image",
        "import",
        tarball.to_str().unwrap_or_default(),
        "--name",
        "x",
    ])
    .success();
    let sif = env.path("x.sif");
    env.sifbox(&["image", "export", "x", sif.to_str().unwrap_or_default()])
        .success();
    let list = run_tool(Command::new(&siftool).arg("list").arg(&sif));
    assert!(
        list.contains("Squashfs") && list.contains("amd64"),
        "{list}"
    );
    let header = run_tool(Command::new(&siftool).arg("header").arg(&sif));
    assert!(header.to_lowercase().contains("amd64"), "{header}");
    // The partition is a squashfs that unsquashfs unpacks to the tree.
    let id = list
        .lines()
        .find(|l| l.contains("Squashfs"))
        .and_then(|l| l.split('|').next())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("no partition in {list}"));
    let part = env.path("part.sqfs");
    let dump = Command::new(&siftool)
        .args(["dump", &id])
        .arg(&sif)
        .output()
        .expect("siftool dump");
    assert!(dump.status.success());
    std::fs::write(&part, &dump.stdout).expect("write");
    let out_dir = env.path("unsquashed");
    run_tool(
        Command::new(&unsquashfs)
            .arg("-no-xattrs")
            .arg("-d")
            .arg(&out_dir)
            .arg(&part),
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("etc/sifbox-test-rootfs")).expect("marker"),
        "sifbox-test-rootfs v1\n"
    );
}

#[test]
fn a_sif_made_by_mksquashfs_and_siftool_runs() {
    let siftool = require("siftool");
    let mksquashfs = require("mksquashfs");
    let env = Env::new();
    // A tree with Apptainer env scripts, as an Apptainer build leaves them.
    let tree = env.path("tree");
    run_tool(Command::new("cp").arg("-a").arg(rootfs()).arg(&tree));
    std::fs::create_dir_all(tree.join(".singularity.d/env")).expect("mkdir");
    std::fs::write(
        tree.join(".singularity.d/env/90-environment.sh"),
        "export FROM_ENV_SCRIPT=\"apptainer style\"\n",
    )
    .expect("write");
    let part = env.path("x.sqfs");
    run_tool(Command::new(&mksquashfs).arg(&tree).arg(&part).args([
        "-comp",
        "gzip",
        "-noappend",
        "-quiet",
    ]));
    let sif = env.path("foreign.sif");
    run_tool(Command::new(&siftool).arg("new").arg(&sif));
    run_tool(
        Command::new(&siftool)
            .args([
                "add",
                "--datatype",
                "4",
                "--parttype",
                "2",
                "--partfs",
                "1",
                "--partarch",
                "2",
            ])
            .arg(&sif)
            .arg(&part),
    );
    let out = env.sifbox(&[
        "run",
        sif.to_str().unwrap_or_default(),
        "sh",
        "-c",
        "cat /etc/sifbox-test-rootfs; echo \"$FROM_ENV_SCRIPT\"",
    ]);
    out.success();
    assert_eq!(out.stdout, "sifbox-test-rootfs v1\napptainer style\n");
}

#[test]
fn concurrent_imports_store_one_copy() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let t = tarball.to_str().unwrap_or_default().to_string();
    let env2 = Env::new();
    let procs: Vec<_> = (0..8)
        .map(|_| {
            Command::new(harness::sifbox_bin())
                .args(["image", "import", &t, "--name", "same:1"])
                .env("SIFBOX_CACHE", env2.cache.path())
                .env("SIFBOX_RUNTIME", env2.sb.runtime())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut digests = Vec::new();
    for p in procs {
        let out = p.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        digests.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    digests.dedup();
    assert_eq!(digests.len(), 1, "{digests:?}");
    assert_eq!(env2.stored().len(), 1, "{:?}", env2.stored());
    // Running needs the unpacked tree: 8 at once use the one tree.
    let runs: Vec<_> = (0..8)
        .map(|_| {
            Command::new(harness::sifbox_bin())
                .args(["run", "same:1", "cat", "/etc/sifbox-test-rootfs"])
                .env("SIFBOX_CACHE", env2.cache.path())
                .env("SIFBOX_RUNTIME", env2.sb.runtime())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run")
        })
        .collect();
    let runs: Vec<_> = runs
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    for r in runs {
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    }
    assert!(env2.tmp_entries().is_empty(), "{:?}", env2.tmp_entries());
}

#[test]
fn killed_importers_leave_the_store_consistent() {
    let env = Env::new();
    // A bigger input so that there is time to kill it mid-way.
    let big = env.path("big");
    run_tool(Command::new("cp").arg("-a").arg(rootfs()).arg(&big));
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..64 {
        let mut data = vec![0u8; 256 * 1024];
        for b in data.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = (seed & 0xff) as u8;
        }
        std::fs::write(big.join(format!("blob{i}")), data).expect("write");
    }
    let tarball = env.path("big.tar");
    run_tool(
        Command::new("tar")
            .arg("-C")
            .arg(&big)
            .arg("-cf")
            .arg(&tarball)
            .arg("."),
    );
    let t = tarball.to_str().unwrap_or_default().to_string();
    for delay_ms in [1u64, 5, 20, 50, 100, 200, 400] {
        let mut child = Command::new(harness::sifbox_bin())
            .args(["image", "import", &t, "--name", "big:1"])
            .env("SIFBOX_CACHE", env.cache.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        // Whatever the moment: either no image, or a whole one that runs.
        let ls: Value = env.sifbox(&["image", "ls", "--json"]).json();
        for img in ls["images"].as_array().cloned().unwrap_or_default() {
            let d = img["digest"].as_str().unwrap_or_default().to_string();
            env.sifbox(&["run", &d, "true"]).success();
        }
    }
    // gc reclaims what the killed ones left; then a clean import works.
    env.sifbox(&["gc"]).success();
    assert!(env.tmp_entries().is_empty(), "{:?}", env.tmp_entries());
    env.sifbox(&["image", "import", &t, "--name", "big:1"])
        .success();
    let out = env.sifbox(&["run", "big:1", "sh", "-c", "ls / | grep -c blob"]);
    out.success();
    assert_eq!(out.stdout.trim(), "64");
}

#[test]
fn bad_images_are_clear_errors() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    env.sifbox(&[
        "image",
        "import",
        tarball.to_str().unwrap_or_default(),
        "--name",
        "ok",
    ])
    .success();
    let sif = env.path("ok.sif");
    env.sifbox(&["image", "export", "ok", sif.to_str().unwrap_or_default()])
        .success();
    let bytes = std::fs::read(&sif).expect("read");
    // Truncated, wrong magic, garbage.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated.sif", bytes[..bytes.len() / 2].to_vec()),
        ("header-only.sif", bytes[..100].to_vec()),
        ("garbage.bin", b"this is not an image at all".to_vec()),
    ];
    for (name, data) in cases {
        let p = env.path(name);
        std::fs::write(&p, data).expect("write");
        let out = env.sifbox(&["image", "import", p.to_str().unwrap_or_default()]);
        out.sifbox_error();
        assert!(out.stderr.contains(name), "{name}: {}", out.stderr);
    }
    let out = env.sifbox(&["run", "no-such-image:7", "true"]);
    out.sifbox_error().stderr_has("no-such-image");
    let out = env.sifbox(&["image", "tag", "ok", "bad name"]);
    out.sifbox_error();
    // Nothing half-made stayed behind.
    assert!(env.tmp_entries().is_empty(), "{:?}", env.tmp_entries());
}
