//! End-to-end tests of images (issue 3): importing, the store, exporting,
//! running images by name, digest and file, interop with Debian's siftool
//! and squashfs-tools, concurrency and crashes of importers.
//!
//! Each test has its own `$SIFBOX_CACHE` and `$SIFBOX_RUNTIME`. Tests that
//! need siftool or mksquashfs say so and fail when they are missing: CI
//! installs them (scripts/install-deps.sh).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::{
    self, copy_rootfs, digest_of, is_root, mode_of, require, rootfs, run_tool, set_mode, tempdir,
    Output, Sifbox, Started, Store, Tree,
};
use serde_json::Value;

/// A test's store plus its runtime dir, and a scratch dir.
struct Env {
    store: Store,
    scratch: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            store: Store::new("sifbox-e2e-cache."),
            scratch: tempdir("sifbox-e2e-img."),
        }
    }

    fn sifbox(&self, args: &[&str]) -> Output {
        self.store.cmd(args).output()
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
        self.store.entries("images")
    }

    /// Asserts that the store holds no image and no unpacked tree.
    #[track_caller]
    fn assert_no_image(&self) {
        assert!(self.stored().is_empty(), "{:?}", self.stored());
        let trees = self.store.entries("rootfs");
        assert!(trees.is_empty(), "{trees:?}");
    }
}

#[test]
fn import_run_tag_export_remove() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let out = env.store.import(&tarball, "bb:1").output();
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
    // A directory or a missing one is named as the problem.
    let dir = env.path("");
    let shown = format!("{}/", dir.display().to_string().trim_end_matches('/'));
    env.sifbox(&["image", "export", "bb:1", &shown])
        .sifbox_error()
        .stderr_has("is a directory; give the file to write, e.g. ");
    let lost = dir.join("no-such-dir/x.sif");
    env.sifbox(&["image", "export", "bb:1", lost.to_str().unwrap_or_default()])
        .sifbox_error()
        .stderr_has("no-such-dir is not a directory");

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
    let siftool = require("siftool", "siftool");
    let unsquashfs = require("unsquashfs", "squashfs-tools");
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    env.store.import(&tarball, "x").output().success();
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
    require("siftool", "siftool");
    require("mksquashfs", "squashfs-tools");
    let env = Env::new();
    // A tree with Apptainer env scripts, as an Apptainer build leaves them.
    let tree = env.path("tree");
    copy_rootfs(&tree);
    std::fs::create_dir_all(tree.join(".singularity.d/env")).expect("mkdir");
    std::fs::write(
        tree.join(".singularity.d/env/90-environment.sh"),
        "export FROM_ENV_SCRIPT=\"apptainer style\"\n",
    )
    .expect("write");
    let sif = harness::foreign_sif(&tree, &env.path(""));
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
fn a_foreign_sif_runs_its_runscript_with_the_arguments() {
    require("siftool", "siftool");
    require("mksquashfs", "squashfs-tools");
    let env = Env::new();
    let tree = env.path("tree");
    copy_rootfs(&tree);
    std::fs::create_dir_all(tree.join(".singularity.d/env")).expect("mkdir");
    std::fs::write(
        tree.join(".singularity.d/env/90-environment.sh"),
        "export FROM_ENV_SCRIPT=sourced\n",
    )
    .expect("write");
    std::fs::write(
        tree.join(".singularity.d/runscript"),
        "#!/bin/sh\necho \"runscript($FROM_ENV_SCRIPT): $*\"\n",
    )
    .expect("write");
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(tree.join(".singularity.d/runscript"), mode).expect("chmod");
    let sif = harness::foreign_sif(&tree, &env.path(""));
    let sif = sif.to_str().unwrap_or_default();
    // As `apptainer run`: the runscript, given the arguments.
    let out = env.sifbox(&["run", sif]);
    out.success();
    assert_eq!(out.stdout, "runscript(sourced): \n");
    let out = env.sifbox(&["run", sif, "echo", "a b"]);
    out.success();
    assert_eq!(out.stdout, "runscript(sourced): echo a b\n");
    // --entrypoint '' runs the command itself.
    let out = env.sifbox(&["run", "--entrypoint", "", sif, "echo", "itself"]);
    out.success();
    assert_eq!(out.stdout, "itself\n");
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
                .env("SIFBOX_CACHE", env2.store.path())
                .env("SIFBOX_RUNTIME", env2.store.sb.runtime())
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
                .env("SIFBOX_CACHE", env2.store.path())
                .env("SIFBOX_RUNTIME", env2.store.sb.runtime())
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
    env2.store.assert_tmp_empty();
}

#[test]
fn killed_importers_leave_the_store_consistent() {
    let env = Env::new();
    // A bigger input so that there is time to kill it mid-way.
    let big = env.path("big");
    copy_rootfs(&big);
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
            .env("SIFBOX_CACHE", env.store.path())
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
    env.store.assert_tmp_empty();
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
    env.store.import(&tarball, "ok").output().success();
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
    env.store.assert_tmp_empty();
}

// ---------------------------------------------------------------------------
// A damaged SIF is refused at import (issue 15)
// ---------------------------------------------------------------------------

/// Where the squashfs partition of a SIF starts (SIF data objects are
/// 4 KiB aligned; squashfs starts with `hsqs`).
fn squashfs_at(sif: &[u8]) -> usize {
    (0..sif.len())
        .step_by(4096)
        .find(|at| sif[*at..].starts_with(b"hsqs"))
        .expect("a squashfs partition in the SIF")
}

fn u64_at(b: &[u8], at: usize) -> usize {
    let v = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    usize::try_from(v).expect("offset")
}

/// `sifbox image import FILE` of a damaged file: refused with the one
/// message, 125, and the store shows and keeps nothing of it.
#[track_caller]
fn refused_as_damaged(env: &Env, file: &Path) {
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let out = env
        .store
        .cmd([OsStr::new("image"), OsStr::new("import"), file.as_os_str()])
        .output();
    out.sifbox_error()
        .stderr_has("the SIF itself is damaged")
        .stderr_has("get the file again")
        .stderr_has(&name);
    assert_eq!(
        out.stderr.lines().count(),
        1,
        "{name}: one line: {}",
        out.stderr
    );
    let ls = env.sifbox(&["image", "ls", "--json"]);
    ls.success();
    assert_eq!(ls.json()["images"], serde_json::json!([]), "{name}");
    for sub in ["images", "rootfs", "tmp", "refs"] {
        assert!(
            env.store.entries(sub).is_empty(),
            "{name}: {sub}/ holds {:?}",
            env.store.entries(sub)
        );
    }
    // Running it is refused the same way, before anything starts.
    let out = env
        .store
        .cmd([OsStr::new("run"), file.as_os_str(), OsStr::new("true")])
        .output();
    out.sifbox_error().stderr_has("the SIF itself is damaged");
    assert!(env.store.entries("images").is_empty(), "{name}");
}

#[test]
fn a_damaged_sif_is_refused_at_import_and_leaves_nothing() {
    let env = Env::new();
    // A good SIF, made by sifbox in another store.
    let maker = Store::new("sifbox-e2e-cache.");
    maker.import(rootfs(), "good").output().success();
    let good = env.path("good.sif");
    maker
        .cmd(["image", "export", "good", good.to_str().unwrap_or_default()])
        .output()
        .success();
    let bytes = std::fs::read(&good).expect("read");
    let part = squashfs_at(&bytes);
    let sb = &bytes[part..part + 96];

    // A flipped byte inside a compressed data block: the first data block
    // follows the superblock, a zlib stream.
    let mut data = bytes.clone();
    assert_eq!(data[part + 96], 0x78, "a zlib header after the superblock");
    data[part + 96 + 100] ^= 0x40;
    let flipped = env.path("flipped-data.sif");
    std::fs::write(&flipped, &data).expect("write");
    refused_as_damaged(&env, &flipped);

    // A corrupted inode table: a byte of its first (compressed) block.
    let mut inodes = bytes.clone();
    let at = part + u64_at(sb, 64);
    assert_eq!(inodes[at + 1] & 0x80, 0, "a compressed metadata block");
    inodes[at + 2 + 16] ^= 0x21;
    let bad_inodes = env.path("bad-inode-table.sif");
    std::fs::write(&bad_inodes, &inodes).expect("write");
    refused_as_damaged(&env, &bad_inodes);

    // The file cut short.
    let cut = env.path("truncated.sif");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).expect("write");
    refused_as_damaged(&env, &cut);

    // A squashfs cut short inside a SIF that is sound itself (as siftool
    // wraps whatever it is given): bytes_used is past the partition.
    require("siftool", "siftool");
    let used = u64_at(sb, 40);
    let sqfs = env.path("cut.sqfs");
    std::fs::write(&sqfs, &bytes[part..part + used / 2]).expect("write");
    let wrapped = env.path("cut-squashfs.sif");
    run_tool(Command::new("siftool").arg("new").arg(&wrapped));
    run_tool(
        Command::new("siftool")
            .args(["add", "--datatype", "4", "--parttype", "2", "--partfs", "1"])
            .args(["--partarch", "2"])
            .arg(&wrapped)
            .arg(&sqfs),
    );
    refused_as_damaged(&env, &wrapped);

    // The good one still imports and runs, and so does one made by
    // mksquashfs and siftool.
    let out = env.store.import(&good, "good").output();
    out.success();
    let out = env.sifbox(&["run", "good", "cat", "/etc/sifbox-test-rootfs"]);
    out.success();
    assert_eq!(out.stdout, "sifbox-test-rootfs v1\n");
    let tree = env.path("tree");
    copy_rootfs(&tree);
    let foreign_dir = env.path("foreign");
    std::fs::create_dir(&foreign_dir).expect("mkdir");
    let foreign = harness::foreign_sif(&tree, &foreign_dir);
    env.store.import(&foreign, "foreign").output().success();
    let out = env.sifbox(&["run", "foreign", "cat", "/etc/sifbox-test-rootfs"]);
    out.success();
    env.store.assert_tmp_empty();
}

// ---------------------------------------------------------------------------
// Who can reach the store and --overlay dirs (issue 12, item 5)
// ---------------------------------------------------------------------------

/// A dir that every user may enter (as /tmp or a home often is), so that
/// only the modes sifbox gives its own dirs keep other users out.
fn open_top(prefix: &str) -> tempfile::TempDir {
    let top = tempdir(prefix);
    set_mode(top.path(), 0o755);
    top
}

/// Runs `args` as the unprivileged user sbtest; `None` (with the reason
/// printed) unless this test runs as root.
fn as_other_user(args: &[&OsStr]) -> Option<std::process::Output> {
    if !is_root() {
        eprintln!("skipped: running a command as another user needs root");
        return None;
    }
    let out = Command::new("runuser")
        .args(["-u", "sbtest", "--"])
        .args(args)
        .output()
        .expect("runuser");
    Some(out)
}

/// Whether sbtest can reach `p` (None: not checked, see [`as_other_user`]).
fn other_user_reaches(p: &Path) -> Option<bool> {
    as_other_user(&[OsStr::new("test"), OsStr::new("-e"), p.as_os_str()])
        .map(|o| o.status.success())
}

/// The test rootfs with a setuid and a setgid decoy (as root: owned by
/// root, a setuid-root file; harmless: a shell script, which the kernel
/// never runs setuid).
fn setid_image(top: &Path) -> PathBuf {
    let root = top.join("setid-tree");
    copy_rootfs(&root);
    let tree = Tree::at(&root);
    for (name, m) in [("suid-decoy", 0o4755), ("sgid-decoy", 0o2755)] {
        let p = format!("usr/bin/{name}");
        tree.file(&p, "#!/bin/sh\necho decoy\n").mode(&p, m);
    }
    root
}

/// The one unpacked tree of a store.
fn only_tree(store: &Path) -> PathBuf {
    let trees: Vec<PathBuf> = std::fs::read_dir(store.join("rootfs"))
        .expect("rootfs/")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(trees.len(), 1, "{trees:?}");
    trees[0].clone()
}

/// A lab group's shared store under `top`: `store.shared = true` in a
/// config file of its own, the store dir in sbtest's group (as root).
struct LabStore {
    store: PathBuf,
    config: PathBuf,
}

impl LabStore {
    fn new(top: &Path) -> LabStore {
        let config = top.join("config");
        std::fs::create_dir_all(config.join("sifbox")).expect("mkdir");
        std::fs::write(
            config.join("sifbox/config.toml"),
            "[store]\nshared = true\n",
        )
        .expect("config");
        let store = top.join("lab-store");
        std::fs::create_dir(&store).expect("mkdir");
        if is_root() {
            // The lab's group: sbtest's.
            std::os::unix::fs::chown(&store, None, Some(sbtest_ids().1)).expect("chgrp");
        }
        LabStore { store, config }
    }

    /// `sifbox ARGS` on the shared store, with its config file.
    fn cmd(&self, sb: &Sifbox, args: &[&str]) -> Output {
        sb.cmd(args)
            .env("SIFBOX_CACHE", &self.store)
            .env("XDG_CONFIG_HOME", &self.config)
            .env_remove("SIFBOX_STORE_SHARED")
            .output()
    }
}

fn store_cmd(sb: &Sifbox, store: &Path, args: &[&str]) -> Output {
    sb.cmd(args)
        .env("SIFBOX_CACHE", store)
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .env_remove("SIFBOX_STORE_SHARED")
        .output()
}

/// The store's trees hold the image's setuid files (as host root,
/// setuid-root ones): the store and every dir in it are 0700, so no other
/// user can reach them; a 0755 store of an older sifbox is tightened.
#[test]
fn the_store_is_private_to_its_owner() {
    let sb = Sifbox::new();
    let top = open_top("sifbox-e2e-private.");
    let image = setid_image(top.path());
    // Fresh: made by sifbox, parents too, whatever the umask.
    let store = top.path().join("cache/sifbox");
    let img = image.to_str().unwrap_or_default();
    store_cmd(&sb, &store, &["image", "import", img, "--name", "setid:1"]).success();
    let out = store_cmd(
        &sb,
        &store,
        &["run", "setid:1", "stat", "-c", "%a", "/usr/bin/suid-decoy"],
    );
    out.success();
    assert_eq!(out.stdout, "4755\n", "a private store keeps the bits");
    assert_eq!(mode_of(&store), 0o700, "the store root");
    for d in [
        "images", "refs", "rootfs", "tmp", "locks", "sources", "blobs", "layers",
    ] {
        assert_eq!(mode_of(&store.join(d)), 0o700, "{d}/");
    }
    let decoy = only_tree(&store).join("usr/bin/suid-decoy");
    assert_eq!(mode_of(&decoy), 0o4755);
    for e in std::fs::read_dir(store.join("images"))
        .expect("images")
        .flatten()
    {
        assert_eq!(mode_of(&e.path()), 0o600, "{}", e.path().display());
    }
    // Another user: the source tree (in a dir anyone enters) is in reach,
    // the store's copy is not.
    if let Some(reaches) = other_user_reaches(&image.join("usr/bin/suid-decoy")) {
        assert!(reaches, "the check itself: sbtest reaches the source tree");
        assert_eq!(
            other_user_reaches(&decoy),
            Some(false),
            "sbtest reaches {}",
            decoy.display()
        );
    }

    // A store an older sifbox made: 0755 throughout.
    let old = top.path().join("old");
    std::fs::create_dir_all(old.join("rootfs/sha256-0")).expect("mkdir");
    set_mode(&old, 0o755);
    set_mode(&old.join("rootfs"), 0o755);
    store_cmd(&sb, &old, &["image", "ls"]).success();
    assert_eq!(mode_of(&old), 0o700);
    assert_eq!(mode_of(&old.join("rootfs")), 0o700);
    if let Some(reaches) = other_user_reaches(&old.join("rootfs/sha256-0")) {
        assert!(!reaches, "sbtest reaches the tightened store");
    }

    // As root: a store that belongs to another user is refused (root's
    // setuid-root trees would be theirs to run).
    if is_root() {
        let theirs = top.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        let (uid, _) = sbtest_ids();
        std::os::unix::fs::chown(&theirs, Some(uid), None).expect("chown");
        store_cmd(&sb, &theirs, &["image", "import", img])
            .sifbox_error()
            .stderr_has("belongs to uid")
            .stderr_has("store.shared");
        assert_eq!(
            std::fs::read_dir(&theirs).expect("dir").count(),
            0,
            "nothing was written into it"
        );
    }
}

/// sbtest's uid and gid.
fn sbtest_ids() -> (u32, u32) {
    let line = std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("sbtest:"))
        .map(str::to_string)
        .expect("a user sbtest");
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().expect("uid"), f[3].parse().expect("gid"))
}

/// A shared store's trees are not writable by its group (the audit's: a
/// member planted a file in a tree's world-writable /tmp and the owner's
/// sandbox ran it): the tree's /tmp loses group and world write, and a
/// member (sbtest, when this runs as root) cannot create a file there;
/// inside a sandbox /tmp is still 1777 and writable, re-made in the
/// sandbox's own upper layer from the tree's `.sifbox-modes`.
#[test]
fn a_shared_stores_trees_are_not_writable_by_its_group() {
    let sb = Sifbox::new();
    let top = open_top("sifbox-e2e-shared-tmp.");
    let image = top.path().join("tree");
    copy_rootfs(&image);
    set_mode(&image.join("tmp"), 0o1777);
    let lab = LabStore::new(top.path());
    let store = lab.store.clone();
    let shared = |args: &[&str]| lab.cmd(&sb, args);
    let img = image.to_str().unwrap_or_default();
    shared(&["image", "import", img, "--name", "tmp:1"]).success();
    let out = shared(&[
        "run",
        "tmp:1",
        "sh",
        "-c",
        "stat -c %a /tmp && touch /tmp/inside && echo written",
    ]);
    out.success();
    assert_eq!(out.stdout, "1777\nwritten\n", "/tmp inside");
    let tree = only_tree(&store);
    assert_eq!(
        mode_of(&tree.join("tmp")) & 0o022,
        0,
        "the tree's /tmp is writable by the group or others"
    );
    assert!(
        !tree.join("tmp/inside").exists(),
        "the sandbox wrote the tree"
    );
    let planted = tree.join("tmp/planted");
    if let Some(o) = as_other_user(&[OsStr::new("touch"), planted.as_os_str()]) {
        assert!(
            !o.status.success(),
            "a member created {}",
            planted.display()
        );
        assert!(!planted.exists());
    }
}

/// A lab group's shared store (`store.shared = true`): the group reads
/// images and runs them, and no tree in it has a setuid or setgid file;
/// the SIF keeps its bits; a private store that becomes shared is
/// stripped first.
#[test]
fn a_shared_store_has_no_setid_files_and_its_group_runs_images() {
    let sb = Sifbox::new();
    let top = open_top("sifbox-e2e-shared.");
    let image = setid_image(top.path());
    let img = image.to_str().unwrap_or_default();
    let lab = LabStore::new(top.path());
    let store = lab.store.clone();
    let shared = |args: &[&str]| lab.cmd(&sb, args);
    // Private first: the tree has its bits.
    store_cmd(&sb, &store, &["image", "import", img, "--name", "setid:1"]).success();
    store_cmd(&sb, &store, &["run", "setid:1", "true"]).success();
    let tree = only_tree(&store);
    assert_eq!(mode_of(&tree.join("usr/bin/suid-decoy")), 0o4755);

    // Shared from now on.
    let out = shared(&["run", "setid:1", "stat", "-c", "%a", "/usr/bin/suid-decoy"]);
    out.success();
    assert_eq!(out.stdout, "755\n", "no setuid bit inside either");
    assert_eq!(mode_of(&store), 0o2750, "the store root");
    for d in ["images", "refs", "rootfs"] {
        assert_eq!(mode_of(&store.join(d)), 0o2750, "{d}/");
    }
    for d in ["tmp", "locks", "sources", "blobs", "layers", "build-cache"] {
        assert_eq!(mode_of(&store.join(d)), 0o700, "{d}/");
    }
    for f in ["usr/bin/suid-decoy", "usr/bin/sgid-decoy"] {
        assert_eq!(mode_of(&tree.join(f)) & 0o6000, 0, "{f} was stripped");
    }
    // A tree unpacked while shared is stripped too.
    shared(&["image", "rm", "setid:1"]).success();
    shared(&["gc"]).success();
    shared(&["image", "import", img, "--name", "setid:1"]).success();
    let out = shared(&["run", "setid:1", "cat", "/etc/sifbox-test-rootfs"]);
    out.success();
    assert_eq!(out.stdout, "sifbox-test-rootfs v1\n");
    let tree = only_tree(&store);
    for f in ["usr/bin/suid-decoy", "usr/bin/sgid-decoy"] {
        assert_eq!(mode_of(&tree.join(f)), 0o755, "{f} was stripped");
    }
    // The SIF keeps the bits: a private store made from it has them.
    let sif = top.path().join("setid.sif");
    shared(&[
        "image",
        "export",
        "setid:1",
        sif.to_str().unwrap_or_default(),
    ])
    .success();
    let mine = top.path().join("mine");
    let out = store_cmd(
        &sb,
        &mine,
        &[
            "run",
            sif.to_str().unwrap_or_default(),
            "stat",
            "-c",
            "%a",
            "/usr/bin/suid-decoy",
        ],
    );
    out.success();
    assert_eq!(out.stdout, "4755\n");

    // A build FROM it starts from a private copy with the bits (under
    // layers/, 0700), so the image built keeps them.
    let ctx = top.path().join("ctx");
    std::fs::create_dir(&ctx).expect("mkdir");
    std::fs::write(ctx.join("Dockerfile"), "FROM setid:1\nRUN touch /built\n").expect("write");
    shared(&[
        "build",
        "-t",
        "built:1",
        "--progress",
        "quiet",
        ctx.to_str().unwrap_or_default(),
    ])
    .success();
    // A build that only sets metadata remakes the base's SIF (issue 15)
    // and publishes the tree as well, which the group could not unpack.
    std::fs::write(ctx.join("Dockerfile"), "FROM setid:1\nLABEL a=b\n").expect("write");
    shared(&[
        "build",
        "-t",
        "labelled:1",
        "--progress",
        "quiet",
        ctx.to_str().unwrap_or_default(),
    ])
    .success();
    // The group's trees (setid:1's and the ones the builds published) are
    // stripped.
    let trees: Vec<PathBuf> = std::fs::read_dir(store.join("rootfs"))
        .expect("rootfs/")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(trees.len(), 3, "{trees:?}");
    for t in &trees {
        assert_eq!(
            mode_of(&t.join("usr/bin/suid-decoy")),
            0o755,
            "{}",
            t.display()
        );
    }
    let built = top.path().join("built.sif");
    shared(&[
        "image",
        "export",
        "built:1",
        built.to_str().unwrap_or_default(),
    ])
    .success();
    let out = store_cmd(
        &sb,
        &mine,
        &[
            "run",
            built.to_str().unwrap_or_default(),
            "stat",
            "-c",
            "%a",
            "/usr/bin/suid-decoy",
        ],
    );
    out.success();
    assert_eq!(
        out.stdout, "4755\n",
        "the built image keeps the base's bits"
    );
    let labelled = top.path().join("labelled.sif");
    shared(&[
        "image",
        "export",
        "labelled:1",
        labelled.to_str().unwrap_or_default(),
    ])
    .success();
    let out = store_cmd(
        &sb,
        &mine,
        &[
            "run",
            labelled.to_str().unwrap_or_default(),
            "sh",
            "-c",
            "stat -c %a /usr/bin/suid-decoy; cat /.singularity.d/labels.json",
        ],
    );
    out.success();
    assert_eq!(out.stdout, "4755\n{\n  \"a\": \"b\"\n}");

    // The group (as root: sbtest's group owns the store) reads it and
    // runs its images, and reaches nothing but what running needs.
    if is_root() {
        let (uid, gid) = sbtest_ids();
        assert_eq!(
            std::os::unix::fs::MetadataExt::gid(
                &std::fs::metadata(store.join("rootfs")).expect("stat")
            ),
            gid,
            "the group carries to the dirs made in it"
        );
        assert_eq!(
            other_user_reaches(&tree.join("usr/bin/suid-decoy")),
            Some(true)
        );
        assert_eq!(other_user_reaches(&store.join("tmp/.")), Some(false));
        assert_eq!(other_user_reaches(&store.join("locks/.")), Some(false));
        let rt = top.path().join("rt-sbtest");
        std::fs::create_dir(&rt).expect("mkdir");
        std::os::unix::fs::chown(&rt, Some(uid), Some(gid)).expect("chown");
        let bin = harness::sifbox_bin();
        let member = |args: &[&str]| {
            let mut all: Vec<&OsStr> = vec![
                OsStr::new("env"),
                OsStr::new("-i"),
                OsStr::new("PATH=/usr/bin:/bin"),
                OsStr::new("HOME=/nonexistent"),
                OsStr::new("SIFBOX_STORE_SHARED=1"),
            ];
            let cache = format!("SIFBOX_CACHE={}", store.display());
            let runtime = format!("SIFBOX_RUNTIME={}", rt.display());
            all.push(OsStr::new(&cache));
            all.push(OsStr::new(&runtime));
            all.push(bin.as_os_str());
            all.extend(args.iter().map(OsStr::new));
            as_other_user(&all).expect("as root")
        };
        let out = member(&["run", "setid:1", "cat", "/etc/sifbox-test-rootfs"]);
        assert!(
            out.status.success(),
            "a member runs the image: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "sifbox-test-rootfs v1\n"
        );
        // An image its owner has not unpacked yet: a clear error.
        let r = rootfs().to_str().unwrap_or_default().to_string();
        shared(&["image", "import", &r, "--name", "plain:1"]).success();
        let out = member(&["run", "plain:1", "true"]);
        assert_eq!(out.status.code(), Some(harness::SIFBOX_ERROR));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not unpacked") && err.contains("owner"),
            "{err}"
        );
    }

    // The environment wins over the config file; nonsense is an error.
    sb.cmd(["image", "ls"])
        .env("SIFBOX_CACHE", &store)
        .env("XDG_CONFIG_HOME", &lab.config)
        .env("SIFBOX_STORE_SHARED", "0")
        .output()
        .success();
    assert_eq!(mode_of(&store), 0o700, "private again: closed at once");
    sb.cmd(["image", "ls"])
        .env("SIFBOX_CACHE", &store)
        .env("SIFBOX_STORE_SHARED", "perhaps")
        .output()
        .sifbox_error()
        .stderr_has("SIFBOX_STORE_SHARED");
}

/// `--overlay DIR` holds what the sandbox wrote (a setuid file, as host
/// root a setuid-root one): DIR is made 0700, an existing one tightened,
/// one of another user refused.
#[test]
fn overlay_dirs_are_private() {
    let sb = Sifbox::new();
    let top = open_top("sifbox-e2e-ovpriv.");
    let ov = top.path().join("made/ov");
    let ov_s = ov.to_str().unwrap_or_default().to_string();
    sb.run([
        "--overlay",
        &ov_s,
        "sh",
        "-c",
        "echo decoy > /decoy && chmod 4755 /decoy",
    ])
    .output()
    .success();
    assert_eq!(mode_of(&ov), 0o700, "DIR");
    assert_eq!(mode_of(&ov.join("work")), 0o700, "DIR/work");
    let decoy = ov.join("upper/decoy");
    assert_eq!(mode_of(&decoy), 0o4755, "what the sandbox wrote");
    if let Some(reaches) = other_user_reaches(&top.path().join("made")) {
        assert!(reaches, "the check itself: sbtest reaches DIR's parent");
        assert_eq!(
            other_user_reaches(&decoy),
            Some(false),
            "sbtest reaches {}",
            decoy.display()
        );
    }
    // An existing DIR open to everyone.
    let old = top.path().join("old");
    std::fs::create_dir_all(old.join("upper")).expect("mkdir");
    set_mode(&old, 0o755);
    sb.run(["--overlay", old.to_str().unwrap_or_default(), "true"])
        .output()
        .success();
    assert_eq!(mode_of(&old), 0o700);
    if is_root() {
        let theirs = top.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        std::os::unix::fs::chown(&theirs, Some(sbtest_ids().0), None).expect("chown");
        sb.run(["--overlay", theirs.to_str().unwrap_or_default(), "true"])
            .output()
            .sifbox_error()
            .stderr_has("belongs to uid");
    }
    harness::make_removable(top.path());
}

/// Unmounts a test's tmpfs when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_image_store_says_so_and_what_to_do() {
    if !is_root() {
        eprintln!("skipped: a small file system for the store needs root to mount");
        return;
    }
    let store = Store::new("sifbox-full-store.");
    run_tool(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
            .arg(store.path()),
    );
    let _mounted = Mounted(store.path().to_path_buf());
    let full = |out: &Output| {
        out.code_is(harness::SIFBOX_ERROR);
        let last = out.stderr.lines().last().unwrap_or_default().to_string();
        assert!(
            last.starts_with(&format!(
                "sifbox: error: no space left on the image store ({}, ",
                store.path().display()
            )),
            "{}",
            out.stderr
        );
        assert!(last.contains(" MB free): "), "{last}");
        assert!(last.contains("sifbox gc"), "{last}");
        for wrong in ["Broken pipe", "check the file", "--insecure"] {
            assert!(!out.stderr.contains(wrong), "{wrong}: {}", out.stderr);
        }
    };
    // An import bigger than the disk.
    let big = tempdir("sifbox-full-src.");
    let tree = big.path().join("tree");
    copy_rootfs(&tree);
    let mut noise = vec![0u8; 32_000_000];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("urandom"),
        &mut noise,
    )
    .expect("read");
    std::fs::write(tree.join("noise.bin"), &noise).expect("write");
    full(&store.import(&tree, "big").output());
    store.assert_tmp_empty();
    // A build whose step fits but whose image does not.
    store.import(rootfs(), "busybox").output().success();
    let ctx = Tree::temp("sifbox-full-ctx.");
    ctx.file(
        "Dockerfile",
        "FROM busybox\nRUN head -c 9000000 /dev/urandom > /big\n",
    );
    let out = store
        .cmd(["build", "-q", &ctx.path().display().to_string()])
        .output();
    full(&out);
    store.assert_tmp_empty();
}

/// `image ls` prints sizes for people (decimal units, as Docker: `148 MB`)
/// and creation times in ISO 8601 (UTC); `image inspect` the same
/// document as `--json` with its size and time made readable; `--json`
/// keeps bytes and Unix seconds.
#[test]
fn image_ls_and_inspect_print_human_sizes_and_iso_times() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let out = env.store.import(&tarball, "human:1").output();
    out.success();
    let digest = digest_of(&out);
    let raw: Value = env.sifbox(&["image", "ls", "--json"]).json();
    let entry = &raw["images"][0];
    let size = entry["size"]
        .as_u64()
        .expect("--json size is a number of bytes");
    let created = entry["created"]
        .as_u64()
        .expect("--json created is a number of Unix seconds");
    assert!(size > 0 && created > 1_600_000_000, "{raw}");

    // ISO 8601, UTC, from date(1) so that the test does its own sums.
    let iso = run_tool(
        Command::new("date")
            .arg("-u")
            .arg("-d")
            .arg(format!("@{created}"))
            .arg("+%Y-%m-%dT%H:%M:%SZ"),
    );
    let iso = iso.trim();
    // Three significant digits in kB/MB/GB.
    let (unit, div) = match size {
        0..=999 => ("B", 1.0),
        1000..=999_999 => ("kB", 1e3),
        1_000_000..=999_999_999 => ("MB", 1e6),
        _ => ("GB", 1e9),
    };
    let value = size as f64 / div;

    let ls = env.sifbox(&["image", "ls"]);
    ls.success();
    let mut lines = ls.stdout.lines();
    let header = lines.next().expect("a header");
    for col in ["DIGEST", "SIZE", "CREATED", "NAMES"] {
        assert!(header.contains(col), "no {col} column: {header}");
    }
    let row = lines.next().expect("a row");
    assert!(row.starts_with(&digest[..19]), "{row}");
    assert!(row.ends_with("human:1"), "{row}");
    assert!(row.contains(iso), "created is not {iso}: {row}");
    let shown = row
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[1] == unit)
        .map(|w| w[0].to_string())
        .unwrap_or_else(|| panic!("no size in {unit}: {row}"));
    let shown_value: f64 = shown.parse().expect("a number");
    assert!(
        (shown_value - value).abs() <= value * 0.006,
        "{shown} {unit} for {size} bytes: {row}"
    );
    assert!(!row.contains(&size.to_string()), "raw bytes in {row}");

    let inspect = env.sifbox(&["image", "inspect", "human:1"]);
    inspect.success();
    let human: Value = serde_json::from_str(&inspect.stdout).expect("inspect is JSON");
    assert_eq!(human["image"]["created"], iso, "{human}");
    assert_eq!(human["image"]["size"], format!("{shown} {unit}"), "{human}");
    assert_eq!(human["image"]["digest"], digest.as_str());
    let json: Value = env
        .sifbox(&["image", "inspect", "--json", "human:1"])
        .json();
    assert_eq!(json["image"]["size"], size, "{json}");
    assert_eq!(json["image"]["created"], created, "{json}");
    assert_eq!(json["config"], human["config"]);
}

/// `image ls` as Docker users read it (issue 26): an untagged image's
/// NAMES is `<none>`, not a blank; CREATED is the image's own time (its
/// SIF's, the time its files are clamped to: for an import, the source
/// file's, here 2020-09-13T12:26:40Z), so the same digest shows the same
/// time in every store, not when each stored it.
#[test]
fn image_ls_shows_none_and_the_images_own_creation_time() {
    let env = Env::new();
    let tar = env.path("old.tar");
    std::fs::write(
        &tar,
        harness::Tarball::new()
            .dir("etc", 0o755)
            .file("etc/hello", 0o644, b"hi\n")
            .bytes(),
    )
    .expect("write");
    // An import's time is its source's (what its entries are clamped to).
    std::fs::File::options()
        .write(true)
        .open(&tar)
        .and_then(|f| f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000)))
        .expect("set the tarball's mtime");
    let t = tar.display().to_string();
    let out = env.sifbox(&["image", "import", &t]);
    out.success();
    let digest = digest_of(&out);
    let ls = env.sifbox(&["image", "ls"]);
    ls.success();
    let row = ls
        .stdout
        .lines()
        .find(|l| l.starts_with(&digest[..19]))
        .unwrap_or_else(|| panic!("no row for {digest}: {}", ls.stdout));
    assert!(row.trim_end().ends_with("<none>"), "{row}");
    assert!(row.contains("2020-09-13T12:26:40Z"), "{row}");
    // Another store, later: the same image, the same time.
    std::thread::sleep(Duration::from_millis(1100));
    let other = Store::new("sifbox-e2e-cache2.");
    let again = other
        .cmd(["image", "import", &t, "--name", "old:1"])
        .output();
    again.success();
    assert_eq!(digest_of(&again), digest);
    let created = |v: Value| v["images"][0]["created"].as_u64();
    let here = created(env.sifbox(&["image", "ls", "--json"]).json());
    let there = created(other.cmd(["image", "ls", "--json"]).output().json());
    assert_eq!(here, Some(1_600_000_000));
    assert_eq!(here, there);
}

/// `gc` on a healthy store says how many lock files nobody held it
/// removed, not one line each (issue 26: 50 `removed .../locks/*.lock`
/// lines); `gc -v` lists them.
#[test]
fn gc_counts_what_it_removed_and_lists_it_with_v() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let make_locks = || {
        env.store.import(&tarball, "gc:1").output().success();
        env.sifbox(&["run", "gc:1", "true"]).success();
        let locks = env.store.entries("locks");
        assert!(!locks.is_empty(), "no lock files left to remove");
        locks.len()
    };
    let n = make_locks();
    let gc = env.sifbox(&["gc"]);
    gc.success();
    assert!(!gc.stdout.contains(".lock"), "{}", gc.stdout);
    let want = if n == 1 {
        "removed 1 lock file nobody held".to_string()
    } else {
        format!("removed {n} lock files nobody held")
    };
    assert!(gc.stdout.contains(&want), "{}", gc.stdout);
    assert!(gc.stdout.contains("sifbox gc -v"), "{}", gc.stdout);
    assert!(gc.stdout.lines().count() <= 12, "{}", gc.stdout);
    let n = make_locks();
    let gc = env.sifbox(&["gc", "-v"]);
    gc.success();
    let listed = gc
        .stdout
        .lines()
        .filter(|l| l.starts_with("removed lock file nobody held ") && l.ends_with(".lock"))
        .count();
    assert_eq!(listed, n, "{}", gc.stdout);
    assert!(env.sifbox(&["gc"]).stdout.contains("nothing to clean up"));
}

// ---------------------------------------------------------------------------
// Images in use (issue 15): `image rm` and the sandboxes, runs and builds
// that use an image; gc and the store's lock files
// ---------------------------------------------------------------------------

/// `sifbox start --name NAME IMAGE` with the test's store; the guard stops
/// it when the test ends.
fn start_image<'a>(env: &'a Env, name: &str, image: &str) -> Started<'a> {
    let out = env
        .store
        .cmd(["start", "--json", "--name", name, image])
        .no_clean_check()
        .output();
    let mut guard = Started::adopt(&env.store.sb, name);
    out.success();
    guard.info = out.json();
    guard.pid = guard.info["supervisor_pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .unwrap_or_else(|| panic!("no supervisor_pid in {}", guard.info));
    guard
}

/// The image names `image ls` lists.
fn names_listed(env: &Env) -> Vec<String> {
    let ls: Value = env
        .store
        .cmd(["image", "ls", "--json"])
        .no_clean_check()
        .output()
        .success()
        .json();
    ls["images"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .flat_map(|i| i["refs"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect()
}

/// `image rm` of an image that a running sandbox uses is refused, naming
/// the sandbox and what to do, and the sandbox keeps its root file system;
/// a one-shot `run` in flight holds the image too; once they end, `rm`
/// works. (On the main branch of before, rm deleted the tree under the
/// running sandbox.)
#[test]
fn image_rm_is_refused_while_a_sandbox_uses_the_image() {
    let env = Env::new();
    let out = env.store.import(rootfs(), "inuse:1").output();
    out.success();
    let digest = digest_of(&out);
    let name = harness::unique("inuse");
    let sandbox = start_image(&env, &name, "inuse:1");

    for r in ["inuse:1", digest.as_str()] {
        env.store
            .cmd(["image", "rm", r])
            .no_clean_check()
            .output()
            .sifbox_error()
            .stderr_has(&name)
            .stderr_has("--force")
            .stderr_has(&format!("sifbox stop {name}"));
    }
    assert_eq!(names_listed(&env), vec!["inuse:1".to_string()]);
    let o = sandbox.exec(&[], &["cat", "/etc/sifbox-test-rootfs"]);
    o.success();
    assert_eq!(o.stdout, "sifbox-test-rootfs v1\n");

    // A one-shot run in flight: refused as well, naming its sandbox.
    let mut run = env
        .store
        .cmd([
            "run",
            "--name",
            "inuse-run",
            "inuse:1",
            "sh",
            "-c",
            "echo up; sleep 2",
        ])
        .no_clean_check()
        .spawn();
    run.wait_for_line(|l| l.contains("up"));
    sandbox.stop();
    env.store
        .cmd(["image", "rm", "inuse:1"])
        .no_clean_check()
        .output()
        .sifbox_error()
        .stderr_has("inuse-run");
    run.wait().success();

    env.sifbox(&["image", "rm", "inuse:1"]).success();
    env.assert_no_image();
}

/// `image rm --force` of an image in use removes its name at once; the
/// sandbox runs on with its root file system, and the image (SIF and
/// tree) goes when that sandbox stops.
#[test]
fn image_rm_force_removes_the_name_now_and_the_image_after_the_last_stop() {
    let env = Env::new();
    env.store.import(rootfs(), "forced:1").output().success();
    let name = harness::unique("forced");
    let sandbox = start_image(&env, &name, "forced:1");
    let out = env
        .store
        .cmd(["image", "rm", "--force", "forced:1"])
        .no_clean_check()
        .output();
    out.success();
    assert!(out.stdout.contains("once no sandbox uses it"), "{out:?}");
    assert!(names_listed(&env).is_empty(), "{:?}", names_listed(&env));
    let ls: Value = env
        .store
        .cmd(["image", "ls", "--json"])
        .no_clean_check()
        .output()
        .success()
        .json();
    assert_eq!(ls["images"], serde_json::json!([]), "{ls}");
    env.store
        .cmd(["run", "forced:1", "true"])
        .no_clean_check()
        .output()
        .sifbox_error();
    // The sandbox is whole: its files, and new ones.
    let o =
        sandbox.sh("cat /etc/sifbox-test-rootfs && ls /bin/sh && echo ok > /tmp/f && cat /tmp/f");
    o.success();
    assert_eq!(o.stdout, "sifbox-test-rootfs v1\n/bin/sh\nok\n");
    assert_eq!(env.store.entries("rootfs").len(), 1);
    // The last user stops: the image goes with it.
    env.store.cmd(["stop", &name]).output().success();
    sandbox.disarm();
    env.assert_no_image();
}

/// A supervisor killed with SIGKILL holds its image no more: `image rm`
/// then works at once.
#[test]
fn a_sigkilled_supervisor_does_not_pin_its_image() {
    let env = Env::new();
    env.store.import(rootfs(), "crashed:1").output().success();
    let name = harness::unique("crashed");
    let sandbox = start_image(&env, &name, "crashed:1");
    env.store
        .cmd(["image", "rm", "crashed:1"])
        .no_clean_check()
        .output()
        .sifbox_error();
    let pid = rustix::process::Pid::from_raw(sandbox.pid).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill -9");
    assert!(
        harness::eventually(Duration::from_secs(5), || harness::proc_of(sandbox.pid)
            .is_none()),
        "the supervisor outlived SIGKILL"
    );
    env.store
        .cmd(["image", "rm", "crashed:1"])
        .no_clean_check()
        .output()
        .success();
    assert!(env.stored().is_empty(), "{:?}", env.stored());
    sandbox.disarm();
    env.sifbox(&["gc"]).success();
}

/// `gc` removes the lock files that imports, runs and killed sifbox
/// processes left in the store, but not one a live process holds (a
/// running sandbox's hold on its image). (On the main branch of before,
/// they were never removed.)
#[test]
fn gc_removes_lock_files_nobody_holds() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let t = tarball.to_str().unwrap_or_default().to_string();
    // Killed mid-import, at a few moments.
    for delay_ms in [0u64, 2, 5, 10, 20, 40] {
        let mut child = Command::new(harness::sifbox_bin())
            .args(["image", "import", &t, "--name", "locks:1"])
            .env("SIFBOX_CACHE", env.store.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
    }
    let out = env.store.import(&tarball, "locks:1").output();
    out.success();
    let digest = digest_of(&out);
    env.sifbox(&["run", "locks:1", "true"]).success();
    let before = env.store.entries("locks");
    assert!(before.len() > 2, "no lock files to clean up: {before:?}");

    let name = harness::unique("locks");
    let sandbox = start_image(&env, &name, "locks:1");
    let pin = format!("image-sha256-{}.lock", digest.trim_start_matches("sha256:"));
    let gc: Value = env
        .store
        .cmd(["gc", "--json"])
        .no_clean_check()
        .output()
        .success()
        .json();
    assert!(
        gc["store"]["stale_locks"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "{gc}"
    );
    assert_eq!(env.store.entries("locks"), vec![pin], "held: kept");
    sandbox.sh("true").success();
    sandbox.stop();
    env.sifbox(&["gc"]).success();
    assert!(
        env.store.entries("locks").is_empty(),
        "{:?}",
        env.store.entries("locks")
    );
    env.store.assert_tmp_empty();
    env.sifbox(&["run", "locks:1", "true"]).success();
}

/// Importers of one source and `gc` removing lock files at the same time:
/// every importer gets the one image, and the store holds one copy (two
/// holders of "the same" lock on two inodes would make it twice, or
/// publish over each other).
#[test]
fn gc_racing_importers_never_splits_a_lock() {
    let env = Env::new();
    let tarball = env.rootfs_tarball();
    let t = tarball.to_str().unwrap_or_default().to_string();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let gc = s.spawn(|| {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                env.store.cmd(["gc"]).no_clean_check().output().success();
                rounds += 1;
            }
            rounds
        });
        for round in 0..3 {
            let name = format!("race:{round}");
            let outs: Vec<Output> = std::thread::scope(|s2| {
                let hs: Vec<_> = (0..4)
                    .map(|_| {
                        let (t, name) = (t.clone(), name.clone());
                        let env = &env;
                        s2.spawn(move || {
                            env.store
                                .cmd(["image", "import", &t, "--name", &name])
                                .no_clean_check()
                                .output()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("join")).collect()
            });
            let digests: Vec<String> = outs
                .iter()
                .map(|o| {
                    o.success();
                    digest_of(o)
                })
                .collect();
            assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(gc.join().expect("gc") > 0);
    });
    assert_eq!(env.stored().len(), 1, "{:?}", env.stored());
    env.sifbox(&["run", "race:2", "true"]).success();
}
