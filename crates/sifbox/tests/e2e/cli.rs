//! End-to-end tests of `sifbox run` (issue 2, item 5).
//!
//! They drive the real `sifbox` binary (`$SIFBOX_BIN`, else the one Cargo
//! built) against the busybox test rootfs (`$SIFBOX_TEST_ROOTFS`, else
//! `target/test-rootfs`, made by `scripts/make-test-rootfs.sh`), and assert
//! on what `sifbox-probe` reports from inside. They pass both as root and as
//! an unprivileged user with a subordinate id range; where the two differ
//! (id maps), the test asks the host what to expect.
//!
//! Every test has its own `$SIFBOX_RUNTIME` (see `harness::Sifbox`) and
//! unique names and markers, so tests run in parallel; after each sandbox
//! run the harness asserts that `$SIFBOX_RUNTIME/sandboxes` is empty and no
//! host mount refers to it. Every command runs under a 30 s deadline.
//!
//! One section per property of issue 2, item 3:
//!  1. identity          6. mounts           11. exit codes
//!  2. namespaces        7. binds            12. teardown
//!  3. environment       8. --cwd            13. bad input
//!  4. host files/home   9. network          14. host root's privilege
//!  5. root file system 10. stdio            15. doctor

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use serde_json::Value;

use crate::harness::{
    self, copy_rootfs, descendants, eventually, host_namespace, map_count, mount_at, mounts,
    my_ids, path_exists, path_kind, processes_with_arg, rootfs, snapshot, snapshot_diff,
    still_running, tempdir, unique, unique_number, writable, Proc, Running, Sifbox, Started,
    DEFAULT_PATH,
};

// ===========================================================================
// 1. Identity: root inside, mapped to the caller; single vs full maps
// ===========================================================================

/// The command runs as uid/gid 0 inside, under an id map.
#[test]
fn identity_is_root_inside() {
    let sb = Sifbox::new();
    let r = sb.probe(&[], &[]);
    for k in ["uid", "gid", "euid", "egid"] {
        assert_eq!(r[k], 0, "{k} inside: {r}");
    }
    assert!(map_count(&r["uid_map"]) >= 1, "uid_map: {}", r["uid_map"]);
    assert!(map_count(&r["gid_map"]) >= 1, "gid_map: {}", r["gid_map"]);
}

/// Runs a sleeping probe with sifbox options `opts`; returns its report and
/// its uid and gid maps as the host sees them. (Inside, the command sits in
/// a nested user namespace whose own map is an identity over the sandbox's;
/// read from the host, `/proc/PID/uid_map` shows host ids.)
fn host_view_of_maps(sb: &Sifbox, opts: &[&str]) -> (Value, Vec<[u64; 3]>, Vec<[u64; 3]>) {
    let marker = format!("/{}", unique("e2e-ids"));
    let mut args: Vec<&str> = opts.to_vec();
    args.extend([
        "--",
        "sifbox-probe",
        "--check-path",
        &marker,
        "--sleep",
        "30",
    ]);
    let mut running = sb.run(args).spawn();
    let report: Value =
        serde_json::from_str(&running.wait_for_line(|l| l.starts_with('{'))).expect("probe report");
    let probes: Vec<i32> = processes_with_arg(&marker)
        .into_iter()
        .filter(|(_, argv)| argv[0] == "sifbox-probe")
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(probes.len(), 1, "the probe on the host: {probes:?}");
    let read = |which: &str| -> Vec<[u64; 3]> {
        let f = format!("/proc/{}/{which}", probes[0]);
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("reading {f}: {e}"))
            .lines()
            .map(|l| {
                let n: Vec<u64> = l
                    .split_whitespace()
                    .map(|x| x.parse().expect("a number"))
                    .collect();
                [n[0], n[1], n[2]]
            })
            .collect()
    };
    let (uid_map, gid_map) = (read("uid_map"), read("gid_map"));
    running.signal(Signal::TERM);
    running.wait().code_is(143);
    sb.assert_clean();
    (report, uid_map, gid_map)
}

/// `--userns single` maps exactly the caller's own uid/gid, to 0.
#[test]
fn identity_single_maps_only_the_caller() {
    let sb = Sifbox::new();
    let (uid, gid) = my_ids();
    let (r, uid_map, gid_map) = host_view_of_maps(&sb, &["--userns", "single"]);
    assert_eq!(r["uid"], 0);
    assert_eq!(
        map_count(&r["uid_map"]),
        1,
        "uid_map inside: {}",
        r["uid_map"]
    );
    assert_eq!(
        map_count(&r["gid_map"]),
        1,
        "gid_map inside: {}",
        r["gid_map"]
    );
    assert_eq!(
        uid_map,
        [[0, u64::from(uid), 1]],
        "uid_map seen from the host"
    );
    assert_eq!(
        gid_map,
        [[0, u64::from(gid), 1]],
        "gid_map seen from the host"
    );
}

/// `--userns full` maps more than one id when the caller may (root, or a
/// user with a subordinate range: the caller at 0, the range from 1);
/// otherwise it is a clear error.
#[test]
fn identity_full_maps_a_range_or_explains_why_not() {
    let sb = Sifbox::new();
    let (uid, gid) = my_ids();
    if uid == 0 || harness::has_subid_range() {
        let (r, uid_map, gid_map) = host_view_of_maps(&sb, &["--userns", "full"]);
        assert_eq!(r["uid"], 0);
        assert!(
            map_count(&r["uid_map"]) > 1,
            "uid_map inside: {}",
            r["uid_map"]
        );
        assert!(
            map_count(&r["gid_map"]) > 1,
            "gid_map inside: {}",
            r["gid_map"]
        );
        for (map, id, file) in [
            (&uid_map, uid, "/etc/subuid"),
            (&gid_map, gid, "/etc/subgid"),
        ] {
            assert!(
                map.iter().map(|l| l[2]).sum::<u64>() > 1,
                "{map:?} seen from the host"
            );
            // The caller itself is root inside.
            assert_eq!(
                map[0][..2],
                [0, u64::from(id)],
                "{map:?} seen from the host"
            );
            if uid != 0 {
                let (start, count) = harness::subid_range(file).expect("a range");
                assert_eq!(
                    map[..],
                    [[0, u64::from(id), 1], [1, start, count]],
                    "map seen from the host vs {file}"
                );
            }
        }
    } else {
        sb.run(["--userns", "full", "true"])
            .output()
            .sifbox_error()
            .stderr_has("subuid");
    }
}

/// chown to another id works with a full map (package managers need it)
/// and fails with a single-id map.
#[test]
fn identity_chown_needs_a_full_map() {
    let sb = Sifbox::new();
    let script = "touch /chowned && chown 5:5 /chowned && ls -ln /chowned";
    if my_ids().0 == 0 || harness::has_subid_range() {
        let out = sb.run(["--userns", "full", "sh", "-c", script]).output();
        out.success();
        let fields: Vec<&str> = out.stdout.split_whitespace().collect();
        assert_eq!(
            fields.get(2..4),
            Some(&["5", "5"][..]),
            "owner after chown: {}",
            out.stdout
        );
    }
    sb.run(["--userns", "single", "sh", "-c", script])
        .output()
        .command_failed()
        .stderr_has("chown");
}

// ===========================================================================
// 2. Namespaces: pid, uts, ipc, mount, user (net: section 9)
// ===========================================================================

/// The sandbox has its own pid namespace: small pids, and only the
/// supervisor and the command are visible.
#[test]
fn namespaces_pid_hides_host_processes() {
    let sb = Sifbox::new();
    let r = sb.probe(&[], &[]);
    let pid = r["pid"].as_u64().expect("pid");
    assert!(pid < 10, "probe pid {pid} is not a fresh namespace's");
    let procs = r["processes"].as_array().expect("processes");
    assert!(
        (2..10).contains(&procs.len()),
        "expected only the supervisor and the probe, got {procs:#?}"
    );
    let pids: Vec<u64> = procs.iter().filter_map(|p| p["pid"].as_u64()).collect();
    assert!(pids.contains(&1) && pids.contains(&pid), "pids: {pids:?}");
    assert!(
        !pids.contains(&u64::from(std::process::id())),
        "the test's own pid is visible: {pids:?}"
    );
    for p in procs {
        let argv0 = p["cmdline"][0].as_str().unwrap_or_default();
        let is_supervisor = argv0 == "sifbox" && p["cmdline"][1] == "sandbox";
        assert!(
            is_supervisor || argv0 == "sifbox-probe",
            "a foreign process is visible inside: {p}"
        );
    }
}

/// Every namespace of the command differs from the host's (network too
/// with --net none, but not with --net host).
#[test]
fn namespaces_differ_from_the_host() {
    let sb = Sifbox::new();
    let script =
        "for n in ipc mnt net pid user uts; do echo \"$n $(readlink /proc/self/ns/$n)\"; done";
    for net in ["host", "none"] {
        let out = sb.run(["--net", net, "sh", "-c", script]).output();
        out.success();
        let mut seen = 0;
        for line in out.stdout.lines() {
            let (name, inside) = line.split_once(' ').expect("NAME LINK");
            assert!(inside.starts_with(name), "bad ns link {line:?}");
            let host = host_namespace(name);
            if name == "net" && net == "host" {
                assert_eq!(inside, host, "--net host must share the host network");
            } else {
                assert_ne!(
                    inside, host,
                    "the {name} namespace is the host's (--net {net})"
                );
            }
            seen += 1;
        }
        assert_eq!(seen, 6, "namespace listing: {}", out.stdout);
    }
}

/// The host name defaults to the sandbox name; --hostname overrides it.
#[test]
fn namespaces_hostname_defaults_to_name() {
    let sb = Sifbox::new();
    let name = unique("e2e-hn");
    let r = sb.probe(&["--name", &name], &[]);
    assert_eq!(r["hostname"], name.as_str());

    let host = unique("e2e-host");
    let r = sb.probe(&["--name", &unique("e2e-hn"), "--hostname", &host], &[]);
    assert_eq!(r["hostname"], host.as_str());

    let r = sb.probe(&[], &[]);
    let hn = r["hostname"].as_str().expect("hostname");
    assert!(hn.starts_with("run-"), "default host name {hn:?}");
}

/// Changing the host name inside (whether or not the kernel allows it
/// there) never changes the host's.
#[test]
fn namespaces_hostname_change_stays_inside() {
    let sb = Sifbox::new();
    let read_host = || {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .expect("host hostname")
            .trim()
            .to_string()
    };
    let before = read_host();
    let new = unique("e2e-changed");
    sb.run(["sh", "-c", &format!("hostname {new}; hostname")])
        .output();
    let after = read_host();
    assert_eq!(before, after, "the host's hostname changed");
    assert_ne!(after, new);
}

// ===========================================================================
// 3. Environment: clean, plus --env / --env-file
// ===========================================================================

/// Only PATH, HOME, LANG, TERM and proxy variables reach the command; a
/// host secret is in no visible process's environment or argv.
#[test]
fn environment_is_clean() {
    let sb = Sifbox::new();
    let secret = unique("s3cr3t");
    let mut inv = sb
        .run(["--", "sifbox-probe"])
        .env("SIFBOX_TEST_SECRET", &secret)
        .env("TERM", "xterm-e2e")
        .env("https_proxy", "http://proxy.invalid:3128")
        .env("HOME", "/home/e2e-host-home")
        .env("LANG", "de_DE.UTF-8")
        .env("PATH", "/e2e/host/bin:/usr/bin:/bin");
    for k in [
        "http_proxy",
        "no_proxy",
        "all_proxy",
        "ftp_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "FTP_PROXY",
    ] {
        inv = inv.env_remove(k);
    }
    let r = inv.output().success().json();
    assert_eq!(
        r["env"],
        serde_json::json!({
            "HOME": "/root",
            "LANG": "C",
            "PATH": DEFAULT_PATH,
            "TERM": "xterm-e2e",
            "https_proxy": "http://proxy.invalid:3128",
        }),
        "environment inside"
    );
    let procs = r["processes"].as_array().expect("processes");
    let mut readable = 0;
    for p in procs {
        assert!(
            !p["cmdline"].to_string().contains(&secret),
            "the secret is in an argv inside: {p}"
        );
        if p["environ"].is_null() {
            continue;
        }
        readable += 1;
        let env = p["environ"].to_string();
        assert!(
            !env.contains(&secret) && !env.contains("SIFBOX_TEST_SECRET"),
            "process {} carries the host environment: {env}",
            p["pid"]
        );
    }
    assert!(readable >= 1, "no environ was readable: {procs:#?}");
}

/// --env and --env-file add variables; --env beats the file; a later --env
/// beats an earlier one; file values are taken literally.
#[test]
fn environment_env_and_env_file() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-env.");
    let file = dir.path().join("vars.env");
    std::fs::write(
        &file,
        "# comment\n\nA=from-file\nB=file-only\nexport C=\"quoted value\"\nD=$(echo no)${HOME}\n",
    )
    .expect("writing env file");
    let file = file.to_str().expect("utf-8 path");
    let r = sb.probe(
        &[
            "--env",
            "A=from-flag",
            "--env-file",
            file,
            "-e",
            "E=1",
            "--env",
            "E=2",
        ],
        &[],
    );
    let env = &r["env"];
    assert_eq!(env["A"], "from-flag", "{env}");
    assert_eq!(env["B"], "file-only", "{env}");
    assert_eq!(env["C"], "quoted value", "{env}");
    assert_eq!(env["D"], "$(echo no)${HOME}", "{env}");
    assert_eq!(env["E"], "2", "{env}");
    assert_eq!(env["HOME"], "/root", "{env}");
}

/// A malformed env file line is an error naming the file and the line.
#[test]
fn environment_bad_env_file_is_an_error() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-env.");
    let file = dir.path().join("bad.env");
    std::fs::write(&file, "A=1\n\nthis line has no equals sign\nB=2\n").expect("write");
    let shown = file.display().to_string();
    sb.run(["--env-file", &shown, "true"])
        .output()
        .sifbox_error()
        .stderr_has(&format!("{shown}:3"));

    let missing = dir.path().join("missing.env").display().to_string();
    sb.run(["--env-file", &missing, "true"])
        .output()
        .sifbox_error()
        .stderr_has(&missing);

    sb.run(["--env", "1BAD=x", "true"])
        .output()
        .sifbox_error()
        .stderr_has("1BAD");
}

// ===========================================================================
// 4. No host home, no host files; the image's files are there
// ===========================================================================

#[test]
fn host_home_and_files_are_invisible() {
    let sb = Sifbox::new();
    // Host-only files in the two usual temp dirs.
    let tmp = tempdir("sifbox-e2e-hostonly.");
    let tmp_file = tmp.path().join("host-only");
    std::fs::write(&tmp_file, "host").expect("write");
    let var_tmp = tempfile::Builder::new()
        .prefix("sifbox-e2e-hostonly.")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp");

    let mut checks: Vec<String> = vec![
        tmp.path().display().to_string(),
        tmp_file.display().to_string(),
        var_tmp.path().display().to_string(),
        std::env::current_exe()
            .expect("current exe")
            .display()
            .to_string(),
        std::env::current_dir().expect("cwd").display().to_string(),
    ];
    // The host home: invisible itself, or (when the image has a dir of that
    // name, as /root) none of its host-only entries are.
    let home = std::env::var("HOME")
        .ok()
        .filter(|h| h.starts_with('/') && h.len() > 1)
        .unwrap_or_else(|| "/root".into());
    let in_image = rootfs().join(home.trim_start_matches('/'));
    if in_image.exists() {
        if let Ok(rd) = std::fs::read_dir(&home) {
            let mut names: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
            names.sort();
            for n in names
                .into_iter()
                .filter(|n| !in_image.join(n).exists())
                .take(20)
            {
                checks.push(Path::new(&home).join(n).display().to_string());
            }
        }
    } else {
        checks.push(home.clone());
    }
    // A path that the image itself has is visible for that reason alone.
    checks.retain(|c| !rootfs().join(c.trim_start_matches('/')).exists());
    assert!(checks.len() >= 3, "too few host paths to check: {checks:?}");
    let marker = "/etc/sifbox-test-rootfs";
    let mut args: Vec<&str> = vec!["--check-path", marker];
    for c in &checks {
        args.extend(["--check-path", c.as_str()]);
    }
    let r = sb.probe(&[], &args);
    assert!(path_exists(&r, marker), "the image's marker is not visible");
    for c in &checks {
        assert!(!path_exists(&r, c), "host path {c} is visible inside");
    }
}

// ===========================================================================
// 5. Root file system: writable, source untouched, --overlay, tmpfs
// ===========================================================================

/// Writes to / succeed inside and leave the source rootfs byte-identical.
#[test]
fn rootfs_writes_leave_the_source_untouched() {
    let sb = Sifbox::new();
    let before = snapshot(rootfs());
    assert!(before.len() > 100, "rootfs snapshot looks empty");
    let new = format!("/{}", unique("newfile"));
    let script = format!(
        "set -e; echo x > {new}; rm /etc/hostname; echo y >> /etc/passwd; \
         chmod 600 /etc/group; mkdir -p /usr/e2e-dir; ln -s /nowhere /bin/e2e-link; \
         rm /bin/cat; cat {new} 2>/dev/null || busybox cat {new}; tail -n1 /etc/passwd; \
         test ! -e /etc/hostname"
    );
    let out = sb.run(["sh", "-c", &script]).output();
    out.success();
    assert_eq!(out.stdout, "x\ny\n");
    let after = snapshot(rootfs());
    assert!(
        before == after,
        "the source rootfs changed:\n{}",
        snapshot_diff(&before, &after)
    );
}

/// `--overlay DIR` keeps the writes in DIR/upper.
#[test]
fn rootfs_overlay_dir_keeps_writes() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-overlay.");
    let name = unique("kept");
    let overlay = dir.path().display().to_string();
    sb.run([
        "--overlay",
        &overlay,
        "sh",
        "-c",
        &format!("echo kept > /{name} && rm /etc/hostname"),
    ])
    .output()
    .success();
    let kept = dir.path().join("upper").join(&name);
    assert_eq!(
        std::fs::read_to_string(&kept).expect("the written file in DIR/upper"),
        "kept\n"
    );
    // The deletion is recorded in the upper dir (a whiteout), not made in
    // the image.
    assert!(
        std::fs::symlink_metadata(dir.path().join("upper/etc/hostname")).is_ok(),
        "no whiteout for /etc/hostname in DIR/upper"
    );
    assert!(rootfs().join("etc/hostname").is_file());
    assert!(!rootfs().join(&name).exists());
    harness::make_removable(dir.path());
}

/// With the (default) tmpfs layer, a second run does not see the first
/// run's writes, and the layer's size limit holds.
#[test]
fn rootfs_tmpfs_writes_do_not_persist() {
    let sb = Sifbox::new();
    let p = format!("/{}", unique("persist"));
    sb.run(["--writable-tmpfs", "sh", "-c", &format!("echo 1 > {p}")])
        .output()
        .success();
    let r = sb.probe(&[], &["--check-path", &p]);
    assert!(!path_exists(&r, &p), "{p} survived into a second sandbox");
    assert!(!rootfs().join(p.trim_start_matches('/')).exists());

    // A 1 MiB layer cannot take 4 MiB.
    sb.run([
        "--tmpfs-size",
        "1",
        "sh",
        "-c",
        "dd if=/dev/zero of=/big bs=1048576 count=4",
    ])
    .output()
    .command_failed();
}

// ===========================================================================
// 6. Mounts: fresh /proc, minimal /dev, tmpfs /tmp, read-only /sys and
//    /proc/sys
// ===========================================================================

#[test]
fn mounts_proc_dev_tmp_sys() {
    let sb = Sifbox::new();
    let dev = [
        ("/dev/null", "char"),
        ("/dev/zero", "char"),
        ("/dev/full", "char"),
        ("/dev/random", "char"),
        ("/dev/urandom", "char"),
        ("/dev/tty", "char"),
        ("/dev/ptmx", ""),
        ("/dev/pts", "dir"),
        ("/dev/shm", "dir"),
        ("/dev/fd", "symlink"),
        ("/dev/stdin", "symlink"),
        ("/dev/stdout", "symlink"),
        ("/dev/stderr", "symlink"),
    ];
    let mut args: Vec<&str> = Vec::new();
    for (p, _) in &dev {
        args.extend(["--check-path", p]);
    }
    for p in ["/tmp", "/dev/shm", "/dev/null", "/sys", "/sys/kernel"] {
        args.extend(["--write-test", p]);
    }
    let r = sb.probe(&[], &args);

    assert_eq!(mount_at(&r, "/proc").map(|m| m.0), Some("proc".into()));
    assert_eq!(mount_at(&r, "/dev").map(|m| m.0), Some("tmpfs".into()));
    assert_eq!(mount_at(&r, "/dev/pts").map(|m| m.0), Some("devpts".into()));
    // /tmp is the image's, in the writable layer (which bounds it), as in
    // Docker: no mount of its own.
    assert_eq!(mount_at(&r, "/tmp"), None);
    for (p, kind) in &dev {
        assert!(path_exists(&r, p), "{p} is missing");
        if !kind.is_empty() {
            assert_eq!(path_kind(&r, p), *kind, "{p}");
        }
    }
    assert!(writable(&r, "/tmp"), "/tmp is not writable");
    assert!(writable(&r, "/dev/shm"), "/dev/shm is not writable");
    assert!(writable(&r, "/dev/null"), "/dev/null is not writable");
    // /sys, where mounted at all, is read-only everywhere.
    for (target, fstype, ro) in mounts(&r) {
        if target == "/sys" || target.starts_with("/sys/") {
            assert!(ro, "{target} ({fstype}) is writable");
        }
    }
    assert!(!writable(&r, "/sys"), "/sys is writable");
    assert!(!writable(&r, "/sys/kernel"), "/sys/kernel is writable");
}

/// The device nodes work.
#[test]
fn mounts_dev_nodes_work() {
    let sb = Sifbox::new();
    let out = sb
        .run([
            "sh",
            "-c",
            "set -e; echo x > /dev/null; head -c 5 /dev/zero | wc -c; \
             head -c 7 /dev/urandom | wc -c; if echo x > /dev/full; then echo full-ok; fi",
        ])
        .output();
    out.success();
    assert_eq!(
        out.stdout.split_whitespace().collect::<Vec<_>>(),
        ["5", "7"]
    );
}

/// /proc/sys and the other host-wide knobs are read-only, and the cover
/// cannot be unmounted from inside.
#[test]
fn mounts_proc_sys_is_read_only() {
    let sb = Sifbox::new();
    let knobs = [
        "/proc/sys/kernel/hostname",
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/vm/drop_caches",
        "/proc/sysrq-trigger",
    ];
    let mut probe = String::from("exec sifbox-probe");
    for k in knobs {
        probe.push_str(&format!(" --write-test {k}"));
    }
    let script = format!(
        "if umount /proc/sys 2>/dev/null || umount -l /proc/sys 2>/dev/null; then echo UNMOUNTED; fi; {probe}"
    );
    let out = sb.run(["sh", "-c", &script]).output();
    out.success();
    assert!(
        !out.stdout.contains("UNMOUNTED"),
        "umount /proc/sys succeeded inside"
    );
    let r = out.json();
    for k in knobs {
        assert!(!writable(&r, k), "{k} is writable inside");
    }
    assert_eq!(mount_at(&r, "/proc/sys").map(|m| m.1), Some(true));
}

// ===========================================================================
// 7. Binds
// ===========================================================================

/// A read-write bind: host files visible, writes from inside land on the
/// host.
#[test]
fn binds_read_write() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-bind.");
    std::fs::write(dir.path().join("in.txt"), "from host\n").expect("write");
    let spec = format!("{}:/data", dir.path().display());
    let out = sb
        .run([
            "--bind",
            &spec,
            "sh",
            "-c",
            "cat /data/in.txt && echo from sandbox > /data/out.txt",
        ])
        .output();
    out.success();
    assert_eq!(out.stdout, "from host\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).expect("out.txt on the host"),
        "from sandbox\n"
    );
    // `:rw` means the same.
    let spec = format!("{}:/data:rw", dir.path().display());
    sb.run(["--bind", &spec, "sh", "-c", "echo rw > /data/rw.txt"])
        .output()
        .success();
    assert!(dir.path().join("rw.txt").is_file());
}

/// A `:ro` bind cannot be written, and the host file stays as it was.
#[test]
fn binds_read_only() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-bind.");
    std::fs::write(dir.path().join("in.txt"), "original\n").expect("write");
    let spec = format!("{}:/data:ro", dir.path().display());
    sb.run(["--bind", &spec, "sh", "-c", "echo changed > /data/in.txt"])
        .output()
        .command_failed();
    sb.run(["--bind", &spec, "sh", "-c", "echo new > /data/new.txt"])
        .output()
        .command_failed();
    let out = sb.run(["--bind", &spec, "cat", "/data/in.txt"]).output();
    out.success();
    assert_eq!(out.stdout, "original\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("in.txt")).expect("read"),
        "original\n"
    );
    assert!(!dir.path().join("new.txt").exists());
}

/// A missing destination is created inside (not in the image); a single
/// file can be bound.
#[test]
fn binds_create_destination_and_bind_files() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-bind.");
    std::fs::write(dir.path().join("in.txt"), "deep\n").expect("write");
    let file = dir.path().join("single.txt");
    std::fs::write(&file, "single\n").expect("write");
    let top = unique("new");
    let deep = format!("{}:/{top}/deep/dir", dir.path().display());
    let single = format!("{}:/etc/e2e-single.txt:ro", file.display());
    let out = sb
        .run([
            "--bind",
            &deep,
            "--bind",
            &single,
            "sh",
            "-c",
            &format!("cat /{top}/deep/dir/in.txt /etc/e2e-single.txt"),
        ])
        .output();
    out.success();
    assert_eq!(out.stdout, "deep\nsingle\n");
    assert!(
        !rootfs().join(&top).exists(),
        "the bind target was made in the image"
    );
    assert!(!rootfs().join("etc/e2e-single.txt").exists());
}

/// A missing source or a malformed spec is sifbox's error.
#[test]
fn binds_bad_specs_are_errors() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-bind.");
    let missing = dir.path().join("no-such-dir").display().to_string();
    sb.run(["--bind", &format!("{missing}:/data"), "true"])
        .output()
        .sifbox_error()
        .stderr_has(&missing);
    let d = dir.path().display().to_string();
    for spec in [
        "a:b:c:d".to_string(),
        format!("{d}:/data:ro:x"),
        format!("{d}:relative/dst"),
        format!("{d}:/d:rx"),
        format!("{d}:/a/../b"),
        ":/data".to_string(),
    ] {
        sb.run(["--bind", &spec, "true"]).output().sifbox_error();
    }
}

// ===========================================================================
// 8. --cwd
// ===========================================================================

#[test]
fn cwd_sets_the_working_directory() {
    let sb = Sifbox::new();
    let out = sb.run(["--cwd", "/tmp", "pwd"]).output();
    out.success();
    assert_eq!(out.stdout, "/tmp\n");
    let out = sb.run(["pwd"]).output();
    out.success();
    assert_eq!(out.stdout, "/\n");
    let missing = format!("/{}", unique("nocwd"));
    sb.run(["--cwd", &missing, "pwd"])
        .output()
        .sifbox_error()
        .stderr_has(&missing);
}

// ===========================================================================
// 9. Network
// ===========================================================================

/// `--net none`: only `lo`, and it is up; `--net host` sees the host's
/// interfaces.
#[test]
fn network_none_has_only_loopback() {
    let sb = Sifbox::new();
    let r = sb.probe(&["--net", "none"], &[]);
    assert_eq!(
        r["interfaces"],
        serde_json::json!([{ "name": "lo", "up": true }]),
        "interfaces with --net none"
    );

    // Interface names as /proc/net/dev lists them (as the probe reads them).
    let host: BTreeSet<String> = std::fs::read_to_string("/proc/net/dev")
        .expect("reading /proc/net/dev")
        .lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_string()))
        .collect();
    let r = sb.probe(&["--net", "host"], &[]);
    let inside: BTreeSet<String> = r["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter_map(|i| i["name"].as_str().map(String::from))
        .collect();
    assert_eq!(inside, host, "--net host must show the host's interfaces");
}

/// `--net none` gets an /etc/hosts of its own with the loopback names and
/// its host name (as Docker writes one), writable by its root, however
/// the image's looks: Debian's bootstrapped trees and Docker's exports
/// ship an empty one, and `localhost` did not resolve (Python's, pip's and
/// Node's clients of a test server failed). The image's file is untouched.
#[test]
fn network_none_has_hosts_with_localhost() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-hosts.");
    let root = dir.path().join("root");
    copy_rootfs(&root);
    std::fs::write(root.join("etc/hosts"), "").expect("empty hosts");
    let out = sb
        .cmd([
            "run",
            "--rootfs",
            root.to_str().expect("utf-8"),
            "--net",
            "none",
            "--hostname",
            "box1",
            "--",
            "sh",
            "-c",
            "cat /etc/hosts && echo '10.9.9.9 extra' >> /etc/hosts && grep -c extra /etc/hosts",
        ])
        .output();
    out.success();
    let said = &out.stdout;
    assert!(said.contains("127.0.0.1\tlocalhost\n"), "{said}");
    assert!(said.contains("::1\tlocalhost"), "{said}");
    assert!(said.contains("127.0.1.1\tbox1\n"), "{said}");
    assert!(said.ends_with("1\n"), "not writable: {out:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/hosts")).expect("read"),
        "",
        "the image's /etc/hosts changed"
    );
}

/// A server on the host's 127.0.0.1 is unreachable with --net none, and
/// reachable with --net host (the default).
#[test]
fn network_none_cannot_reach_host_loopback() {
    let sb = Sifbox::new();
    let listener = TcpListener::bind("127.0.0.1:0").expect("listening on 127.0.0.1");
    let target = listener.local_addr().expect("local addr").to_string();
    let connect = |opts: &[&str]| -> Value {
        let r = sb.probe(opts, &["--connect", &target]);
        r["connect"][target.as_str()].clone()
    };
    let none = connect(&["--net", "none"]);
    assert_eq!(none["ok"], false, "--net none reached the host: {none}");
    let host = connect(&["--net", "host"]);
    assert_eq!(host["ok"], true, "--net host could not connect: {host}");
    let default = connect(&[]);
    assert_eq!(
        default["ok"], true,
        "default net could not connect: {default}"
    );
    drop(listener);
}

// ===========================================================================
// 10. stdio
// ===========================================================================

#[test]
fn stdio_passes_through_and_stays_separate() {
    let sb = Sifbox::new();
    let out = sb.run(["cat"]).stdin(b"hello\n").output();
    out.success();
    assert_eq!(out.stdout, "hello\n");

    let out = sb.run(["sh", "-c", "echo out; echo err >&2"]).output();
    out.success();
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "err\n");

    // A large stream survives intact.
    let big: Vec<u8> = (0..200_000u32)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    let out = sb.run(["wc", "-c"]).stdin(&big).output();
    out.success();
    assert_eq!(out.stdout.trim(), big.len().to_string());

    // -t without a terminal falls back to plain pipes.
    let out = sb.run(["-t", "sh", "-c", "echo tty-less"]).output();
    out.success();
    assert_eq!(out.stdout, "tty-less\n");
}

/// `-t` with a terminal: the command gets a pty of the sandbox's own devpts
/// as its controlling terminal, sees the caller's window size, and its exit
/// code still comes back. util-linux's `script` provides the terminal.
#[test]
fn stdio_tty_gives_a_pty_inside() {
    let sb = Sifbox::new();
    let inner = format!(
        "stty rows 33 cols 77; {} run --rootfs {} -t -- sh -c 'tty; stty size; test -t 0 && test -t 1 && echo both-ttys; exit 7'",
        harness::sifbox_bin().display(),
        rootfs().display()
    );
    let out = sb
        .program("script", ["-q", "-e", "-c", inner.as_str(), "/dev/null"])
        .output();
    out.code_is(7);
    assert!(
        out.stdout.contains("/dev/pts/0"),
        "tty inside: {:?}",
        out.stdout
    );
    assert!(
        out.stdout.contains("33 77"),
        "window size inside: {:?}",
        out.stdout
    );
    assert!(
        out.stdout.contains("both-ttys"),
        "stdio on the pty: {:?}",
        out.stdout
    );
}

// ===========================================================================
// 11. Exit codes
// ===========================================================================

#[test]
fn exit_codes_of_commands() {
    let sb = Sifbox::new();
    sb.run(["true"]).output().code_is(0);
    sb.run(["false"]).output().code_is(1);
    sb.run(["sh", "-c", "exit 7"]).output().code_is(7);
    sb.run(["sh", "-c", "kill -TERM $$"]).output().code_is(143);
    sb.run(["sh", "-c", "kill -KILL $$"]).output().code_is(137);
    let missing = unique("no-such-command");
    sb.run([missing.as_str()])
        .output()
        .code_is(127)
        .stderr_has(&missing);
    sb.run(["/usr/bin/not-executable-test"])
        .output()
        .code_is(126)
        .stderr_has("not-executable-test");
}

/// A command starts as a program expects: no signal ignored or blocked
/// (posix_spawn in glibc used to leave its internal signals 32 and 33
/// ignored, and ignored signals survive exec), by `run`, by `exec`, with a
/// user and with a pty; and a command that cannot start reads the same in
/// `run` and `exec`, on one `sifbox: error:` line.
#[test]
fn commands_start_with_default_signals_and_one_error_line() {
    let sb = Sifbox::new();
    // grep itself (a shell would set up signals of its own).
    let sigs = ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"];
    let clean = "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n";
    let missing = unique("no-such-command");
    let out = sb.run(sigs).output();
    out.success();
    assert_eq!(out.stdout, clean);
    let run_missing = sb.run([missing.as_str()]).output();
    let run_noexec = sb.run(["/etc/passwd"]).output();
    let sandbox = Started::plain(&sb, "signals");
    for opts in [&[][..], &["-u", "1000"][..]] {
        let out = sandbox.exec(opts, &sigs);
        out.success();
        assert_eq!(out.stdout, clean, "exec {opts:?}");
    }
    let exec_missing = sandbox.exec(&[], &[missing.as_str()]);
    for out in [&run_missing, &exec_missing] {
        out.code_is(127);
        assert_eq!(
            out.stderr,
            format!("sifbox: error: {missing}: command not found\n")
        );
    }
    let exec_noexec = sandbox.exec(&[], &["/etc/passwd"]);
    for out in [&run_noexec, &exec_noexec] {
        out.code_is(126);
        assert_eq!(
            out.stderr,
            "sifbox: error: /etc/passwd: permission denied\n"
        );
    }
}

/// The host's `ps` shows a sandbox's supervisor processes (outer and
/// init) as `sifbox sandbox NAME`, for `start` and for a one-shot `run`.
#[test]
fn host_ps_shows_the_sandboxes_name() {
    let sb = Sifbox::new();
    let titled = |name: &str| -> Vec<i32> {
        processes_with_arg(name)
            .into_iter()
            .filter(|(_, argv)| argv == &["sifbox", "sandbox", name])
            .map(|(pid, _)| pid)
            .collect()
    };
    let sandbox = Started::plain(&sb, "titled");
    assert!(
        titled(&sandbox.name).len() >= 2,
        "{:?}",
        processes_with_arg(&sandbox.name)
    );
    assert!(titled(&sandbox.name).contains(&sandbox.pid));
    drop(sandbox);
    let name = unique("titled-run");
    let mut child = std::process::Command::new(harness::sifbox_bin())
        .args(["run", "--name", &name, "--rootfs"])
        .arg(rootfs())
        .args(["sleep", "30"])
        .env("SIFBOX_RUNTIME", sb.runtime())
        .spawn()
        .expect("run");
    assert!(
        eventually(Duration::from_secs(10), || titled(&name).len() >= 2),
        "{:?}",
        processes_with_arg(&name)
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(eventually(Duration::from_secs(10), || titled(&name).is_empty()));
}

/// `run`/`start --host-ca[=FILE]` and SIFBOX_HOST_CA show the host's CA
/// bundle at /run/sifbox/host-ca.crt (read-only) with SSL_CERT_FILE and
/// the like pointing at it, to the command and to later execs; a variable
/// the caller sets wins; a missing file is bad input.
#[test]
fn host_ca_is_shown_to_commands() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-ca.");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, "sifbox test ca\n").expect("write");
    let flag = format!("--host-ca={}", ca.display());
    let show = "cat /run/sifbox/host-ca.crt; echo \"$SSL_CERT_FILE $PIP_CERT $GIT_SSL_CAINFO\"; echo x > /run/sifbox/host-ca.crt || echo read-only";
    let want =
        "sifbox test ca\n/run/sifbox/host-ca.crt /run/sifbox/host-ca.crt /run/sifbox/host-ca.crt\n";
    let out = sb.run([flag.as_str(), "sh", "-c", show]).output();
    out.success();
    assert!(
        out.stdout.starts_with(want) && out.stdout.ends_with("read-only\n"),
        "{}",
        out.stdout
    );
    let out = sb
        .run([
            "sh",
            "-c",
            "echo \"${SSL_CERT_FILE:-none}\"; cat /run/sifbox/host-ca.crt",
        ])
        .env("SIFBOX_HOST_CA", &ca)
        .output();
    out.success();
    assert_eq!(out.stdout, "/run/sifbox/host-ca.crt\nsifbox test ca\n");
    let out = sb
        .run([
            flag.as_str(),
            "-e",
            "SSL_CERT_FILE=/mine",
            "sh",
            "-c",
            "echo $SSL_CERT_FILE",
        ])
        .output();
    assert_eq!(out.stdout, "/mine\n");
    let out = sb
        .run([
            "sh",
            "-c",
            "echo \"${SSL_CERT_FILE:-none}\"; test -e /run/sifbox/host-ca.crt || echo absent",
        ])
        .output();
    assert_eq!(out.stdout, "none\nabsent\n");
    sb.run(["--host-ca=/nonexistent/ca.crt", "true"])
        .output()
        .sifbox_error()
        .stderr_has("no such file");
    let sandbox = Started::new(&sb, &unique("ca"), &[flag.as_str()], &[]);
    let out = sandbox.exec(
        &[],
        &["sh", "-c", "echo $SSL_CERT_FILE; cat $SSL_CERT_FILE"],
    );
    assert_eq!(out.stdout, "/run/sifbox/host-ca.crt\nsifbox test ca\n");
}

#[test]
fn exit_codes_of_sifbox_errors() {
    let sb = Sifbox::new();
    let missing = format!("/nonexistent/{}", unique("rootfs"));
    sb.cmd(["run", "--rootfs", &missing, "true"])
        .output()
        .sifbox_error()
        .stderr_has(&missing);
    sb.cmd(["run", missing.as_str(), "true"])
        .output()
        .sifbox_error()
        .stderr_has(&missing);
    // The image is a file, not a directory.
    let file = rootfs().join("etc/passwd").display().to_string();
    sb.cmd(["run", "--rootfs", &file, "true"])
        .output()
        .sifbox_error();
    // No command, no image.
    sb.run(Vec::<&str>::new()).output().sifbox_error();
    sb.run(["--"]).output().sifbox_error();
    sb.cmd(["run"]).output().sifbox_error();
    // Usage errors.
    sb.cmd(["--no-such-flag"]).output().usage_error();
    sb.run(["--net", "bogus", "true"]).output().usage_error();
    sb.cmd(["no-such-subcommand"]).output().usage_error();
}

/// An unknown option of `run`, wherever it stands before the command, is
/// a usage error, not an image or a command name.
#[test]
fn exit_codes_unknown_run_flag_is_a_usage_error() {
    let sb = Sifbox::new();
    sb.run(["--no-such-flag", "true"])
        .output()
        .usage_error()
        .stderr_has("--no-such-flag");
    let root = rootfs().display().to_string();
    sb.cmd(["run", "--no-such-flag", root.as_str(), "true"])
        .output()
        .usage_error()
        .stderr_has("--no-such-flag");
    // After the command, options belong to the command.
    let out = sb.run(["echo", "--no-such-flag"]).output();
    out.success();
    assert_eq!(out.stdout, "--no-such-flag\n");
}

// ===========================================================================
// 12. Teardown: nothing survives, whatever ends the run
// ===========================================================================

/// A background process left behind by the command is killed with the
/// sandbox.
#[test]
fn teardown_kills_background_processes() {
    let sb = Sifbox::new();
    let marker = unique_number().to_string();
    let out = sb
        .run(["sh", "-c", &format!("sleep {marker} & echo started")])
        .output();
    out.success();
    assert_eq!(out.stdout, "started\n");
    let left = processes_with_arg(&marker);
    assert!(left.is_empty(), "sandbox processes survived: {left:?}");
}

/// `sifbox run` of a probe that sleeps 60 s with a marker path (named
/// after `prefix`) in its arguments, once the probe has reported: the
/// marker, the run, and the run's process tree (at least the supervisor's
/// processes and the probe's).
fn sleeping_probe(sb: &Sifbox, prefix: &str) -> (String, Running, Vec<Proc>) {
    let marker = format!("/{}", unique(prefix));
    let mut running = sb
        .run([
            "--",
            "sifbox-probe",
            "--check-path",
            marker.as_str(),
            "--sleep",
            "60",
        ])
        .spawn();
    running.wait_for_line(|l| l.starts_with('{'));
    let tree = descendants(running.pid());
    assert!(
        tree.len() >= 3,
        "expected supervisor and probe processes, got {tree:?}"
    );
    (marker, running, tree)
}

/// SIGTERM / SIGINT to `sifbox run`: it exits 128+N within seconds, with
/// no sandbox process and no runtime dir left.
fn teardown_on_signal(sig: Signal, code: i32) {
    let sb = Sifbox::new();
    let (marker, running, tree) = sleeping_probe(&sb, "e2e-sig");
    assert!(
        !processes_with_arg(&marker).is_empty(),
        "probe not found on the host"
    );
    let started = std::time::Instant::now();
    running.signal(sig);
    let out = running.wait();
    out.code_is(code);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "sifbox took {:?} to stop",
        started.elapsed()
    );
    let left = still_running(&tree);
    assert!(
        left.is_empty(),
        "processes of the sandbox survived: {left:?}"
    );
    assert!(processes_with_arg(&marker).is_empty(), "the probe survived");
    sb.assert_clean();
}

#[test]
fn teardown_on_sigterm() {
    teardown_on_signal(Signal::TERM, 143);
}

#[test]
fn teardown_on_sigint() {
    teardown_on_signal(Signal::INT, 130);
}

/// Starts a sandbox that sleeps, SIGKILLs `sifbox run`, and asserts that
/// every process of the sandbox dies within seconds.
fn sigkill_a_run(sb: &Sifbox) {
    let (marker, running, tree) = sleeping_probe(sb, "e2e-kill");
    running.signal(Signal::KILL);
    let out = running.wait();
    assert_eq!(
        out.status.code(),
        None,
        "sifbox was not killed: {:?}",
        out.status
    );
    assert!(
        eventually(Duration::from_secs(5), || still_running(&tree).is_empty()
            && processes_with_arg(&marker).is_empty()),
        "sandbox processes survived SIGKILL of sifbox: {:?}",
        still_running(&tree)
    );
    // Nothing is mounted on the host either way.
    sb.assert_no_host_mounts();
}

/// SIGKILL to `sifbox run`: every sandbox process dies within seconds.
#[test]
fn teardown_on_sigkill() {
    let sb = Sifbox::new();
    sigkill_a_run(&sb);
}

/// The runtime dir that a SIGKILLed `sifbox run` may leave is removed by
/// `sifbox gc`, and by the next `sifbox run`.
///
/// Both must work as soon as no process of the sandbox runs, also where the
/// host's PID 1 reaps orphans late (containers, CI runners, this VM): the
/// dead outer supervisor is then a zombie for a while.
#[test]
fn teardown_after_sigkill_gc_and_next_run_clean_up() {
    let sb = Sifbox::new();
    sigkill_a_run(&sb);
    let out = sb.cmd(["gc", "--json"]).output();
    out.success();
    let report = out.json();
    assert_eq!(
        report["removed_sandboxes"].as_array().map(Vec::len),
        Some(1),
        "gc --json: {report}"
    );

    sigkill_a_run(&sb);
    sb.run(["true"]).output().success();
}

// ===========================================================================
// 13. Bad input: exit 125, one clear line, nothing left behind
// ===========================================================================

/// A runtime dir that cannot be created.
#[test]
fn bad_input_unusable_runtime_dir() {
    let sb = Sifbox::new();
    let dir = tempdir("sifbox-e2e-rt-bad.");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("write");
    let rt = file.join("runtime");
    let out = sb
        .run(["true"])
        .env("SIFBOX_RUNTIME", &rt)
        .no_clean_check()
        .output();
    out.sifbox_error().stderr_has(&rt.display().to_string());
    assert!(
        file.is_file(),
        "the file under the runtime dir was replaced"
    );
    assert!(sb.leftovers().is_empty());
}

/// An invalid sandbox name.
#[test]
fn bad_input_invalid_name() {
    let sb = Sifbox::new();
    for name in ["a/b", "..", "", "has space"] {
        sb.run(["--name", name, "true"]).output().sifbox_error();
    }
}

/// User namespaces unavailable (max_user_namespaces = 0 in an enclosing
/// namespace): an error pointing at user namespaces and `sifbox doctor`.
#[test]
fn bad_input_user_namespaces_unavailable() {
    let sb = Sifbox::new();
    let unshare = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("util-linux unshare is needed for this test");
    let bin = harness::sifbox_bin().display().to_string();
    let root = rootfs().display().to_string();
    let out = sb
        .program(
            unshare,
            [
                "-Ur",
                "sh",
                "-c",
                "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"",
                "sh",
                bin.as_str(),
                "run",
                "--rootfs",
                root.as_str(),
                "true",
            ],
        )
        .output();
    out.sifbox_error()
        .stderr_has("user namespace")
        .stderr_has("sifbox doctor");
}

/// Other rejected options.
#[test]
fn bad_input_other_options() {
    let sb = Sifbox::new();
    sb.run(["--tmpfs-size", "0", "true"])
        .output()
        .sifbox_error();
    sb.run(["--hostname", &"h".repeat(65), "true"])
        .output()
        .sifbox_error();
    let dir = tempdir("sifbox-e2e-overlay.");
    let overlay = dir.path().display().to_string();
    sb.run(["--overlay", &overlay, "--writable-tmpfs", "true"])
        .output()
        .usage_error();
}

// ===========================================================================
// 14. Host root gets no host privilege
// ===========================================================================

/// Root inside (also when sifbox runs as host root) cannot touch host-wide
/// kernel state, make device nodes, or add mounts the host sees.
#[test]
fn host_privilege_does_not_reach_inside() {
    let sb = Sifbox::new();
    let out = sb
        .run([
            "sh",
            "-c",
            "echo e2e > /proc/sys/kernel/hostname && echo WROTE-HOSTNAME; \
             echo h > /proc/sysrq-trigger && echo WROTE-SYSRQ; \
             mknod /tmp/e2e-blk b 8 0 && echo MADE-BLOCKDEV; \
             mknod /tmp/e2e-mem c 1 1 && echo MADE-CHARDEV; \
             true",
        ])
        .output();
    out.success();
    for bad in [
        "WROTE-HOSTNAME",
        "WROTE-SYSRQ",
        "MADE-BLOCKDEV",
        "MADE-CHARDEV",
    ] {
        assert!(!out.stdout.contains(bad), "{bad}: {}", out.stdout);
    }

    // A mount made inside stays inside.
    let source = unique("e2e-mnt");
    let mut running = sb
        .run([
            "sh",
            "-c",
            &format!(
                "mkdir -p /mnt && mount -t tmpfs {source} /mnt && grep -q {source} /proc/self/mountinfo && echo MOUNTED; echo READY; exec sleep 60"
            ),
        ])
        .spawn();
    running.wait_for_line(|l| l == "READY");
    for f in ["/proc/self/mountinfo", "/proc/1/mountinfo"] {
        if let Ok(text) = std::fs::read_to_string(f) {
            assert!(
                !text.contains(&source),
                "the sandbox's mount shows in the host's {f}"
            );
        }
    }
    running.signal(Signal::TERM);
    running.wait().code_is(143);
    sb.assert_clean();
}

// ===========================================================================
// 15. sifbox doctor
// ===========================================================================

#[test]
fn doctor_reports_what_sifbox_run_needs() {
    let sb = Sifbox::new();
    let out = sb.cmd(["doctor", "--json"]).output();
    out.success();
    let report = out.json();
    let checks = report["checks"].as_array().expect("checks array");
    for c in checks {
        assert!(
            c["name"].is_string()
                && c["ok"].is_boolean()
                && c.get("detail").is_some()
                && c.get("fix").is_some(),
            "malformed check {c}"
        );
    }
    for name in ["user namespaces", "overlayfs in a user namespace"] {
        let c = checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check named {name:?} in {report}"));
        assert_eq!(c["ok"], true, "doctor says {name} does not work here: {c}");
    }
    // One line per limit says what enforces it here; the plan comes along.
    for name in [
        "cgroups",
        "limit: memory",
        "limit: memory+swap",
        "limit: pids",
        "limit: cpus",
        "limit: storage",
    ] {
        assert!(
            checks.iter().any(|c| c["name"] == name),
            "no check named {name:?} in {report}"
        );
    }
    assert!(report["limits"]["applied"].is_array(), "{report}");
    // The text form names the same checks.
    let text = sb.cmd(["doctor"]).output();
    text.success();
    assert!(text.stdout.contains("user namespaces"), "{}", text.stdout);
    assert!(text.stdout.contains("limit: pids"), "{}", text.stdout);
    // A check at level FAIL (something sifbox run needs) makes the exit status 1 (the report
    // is still printed).
    let file = harness::tempdir("sifbox-e2e-doctor.");
    let not_dir = file.path().join("f");
    std::fs::write(&not_dir, "").expect("write");
    let out = std::process::Command::new(harness::sifbox_bin())
        .arg("doctor")
        .env("SIFBOX_RUNTIME", not_dir.join("rt"))
        .output()
        .expect("doctor");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL runtime dir"));
}

/// The runtime dir doctor names is the one `sifbox start` puts its
/// sandboxes in: doctor asks the engine's own rule (issue 26: it named
/// /tmp/sifbox-UID while sandboxes lived in /dev/shm/sifbox-UID). Without
/// SIFBOX_RUNTIME and XDG_RUNTIME_DIR, as the first user meets it.
#[test]
fn doctor_names_the_runtime_dir_sifbox_start_uses() {
    let sb = Sifbox::new();
    let plain = |args: &[&str]| {
        sb.cmd(args)
            .env_remove("SIFBOX_RUNTIME")
            .env_remove("XDG_RUNTIME_DIR")
            .no_clean_check()
            .output()
    };
    let report = plain(&["doctor", "--json"]);
    report.success();
    let report = report.json();
    let check = report["checks"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "runtime dir"))
        .unwrap_or_else(|| panic!("no runtime dir check: {report}"))
        .clone();
    assert_eq!(check["ok"], true, "{check}");
    let detail = check["detail"].as_str().expect("detail");
    let named = detail.split(" (").next().expect("a path");
    let name = unique("doctor-rt");
    let rootfs = rootfs().display().to_string();
    plain(&["start", "--rootfs", &rootfs, "--name", &name]).success();
    let there = Path::new(named).join("sandboxes").join(&name).is_dir();
    plain(&["stop", &name]).success();
    assert!(
        there,
        "doctor names {named} ({detail}), but `sifbox start` put {name} elsewhere"
    );
}

/// Doctor's three levels: ok, missing-but-optional (`opt`: what is lost
/// and what sifbox does instead) and FAIL only for what stops `sifbox
/// run`; the exit status follows FAIL alone. On this machine (apptainer
/// absent; as the unprivileged user no cgroups, no /dev/fuse, tmpfs
/// layers) nothing stops `sifbox run`: no FAIL line, exit 0 (issue 26: it
/// printed FAIL for each of them, as root and as sbtest). A runtime dir
/// that cannot be made is the one FAIL, and exit 1.
#[test]
fn doctor_fails_only_for_what_stops_sifbox_run() {
    let sb = Sifbox::new();
    // What doctor says works does: `sifbox run` here.
    sb.run(["--", "true"]).output().success();
    let text = sb.cmd(["doctor"]).output();
    text.success();
    assert!(!text.stdout.contains("FAIL"), "{}", text.stdout);
    assert!(
        text.stdout.contains("sifbox run works here"),
        "{}",
        text.stdout
    );
    let report = sb.cmd(["doctor", "--json"]).output().success().json();
    let checks = report["checks"].as_array().expect("checks");
    for c in checks {
        let level = c["level"]
            .as_str()
            .unwrap_or_else(|| panic!("no level: {c}"));
        assert!(["ok", "optional"].contains(&level), "{c}");
        assert_eq!(c["ok"], level == "ok", "{c}");
        if level == "optional" {
            // What it does without says so, and how to have it.
            assert!(c["fix"].is_string(), "{c}");
        }
    }
    // Apptainer is never needed: ok where installed, else optional.
    let app = checks
        .iter()
        .find(|c| c["name"] == "apptainer")
        .expect("an apptainer check");
    assert!(
        app["detail"]
            .as_str()
            .is_some_and(|d| d.contains("does not need"))
            || app["level"] == "ok",
        "{app}"
    );
    // The example values are explained: the flags they are for.
    let cpus = checks
        .iter()
        .find(|c| c["name"] == "limit: cpus")
        .expect("a cpus line");
    assert!(
        cpus["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("for `sifbox run --cpus 1.5`")),
        "{cpus}"
    );
    // A runtime dir under a file: `sifbox run` cannot start a sandbox.
    let file = tempdir("sifbox-e2e-doctor.");
    let not_dir = file.path().join("f");
    std::fs::write(&not_dir, "").expect("write");
    let bad = not_dir.join("rt");
    sb.run(["--", "true"])
        .env("SIFBOX_RUNTIME", &bad)
        .no_clean_check()
        .output()
        .code_is(125);
    let out = sb
        .cmd(["doctor"])
        .env("SIFBOX_RUNTIME", &bad)
        .no_clean_check()
        .output();
    out.code_is(1);
    let fails: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("FAIL"))
        .collect();
    assert_eq!(fails.len(), 1, "{}", out.stdout);
    assert!(fails[0].contains("FAIL runtime dir"), "{}", out.stdout);
    assert!(
        out.stdout.contains("sifbox run cannot work here"),
        "{}",
        out.stdout
    );
}

/// A closed stdout (`sifbox ps --json | head -c 1` once head has gone) ends
/// sifbox quietly with status 0, where `println!` used to panic (exit 134
/// and a backtrace). The reader is gone before sifbox writes a byte.
#[test]
fn a_closed_stdout_is_a_quiet_exit() {
    let sb = Sifbox::new();
    let store = harness::tempdir("sifbox-e2e-store.");
    let name = unique("closed");
    let rootfs = harness::rootfs().display().to_string();
    sb.cmd(["start", "--rootfs", &rootfs, "--name", &name])
        .no_clean_check()
        .output()
        .success();
    // A build whose only output on stdout is the digest.
    let ctx = harness::tempdir("sifbox-e2e-ctx.");
    std::fs::write(ctx.path().join("Dockerfile"), "FROM scratch\nLABEL a=b\n").expect("write");
    let ctx_arg = ctx.path().display().to_string();
    // What the commands make in TMPDIR (a build's scratch dir) is gone
    // when they end, a closed stdout notwithstanding.
    let tmp = harness::tempdir("sifbox-e2e-tmp.");
    let cases: [&[&str]; 6] = [
        &["ps", "--json"],
        &["ps"],
        &["image", "ls", "--json"],
        &["doctor", "--json"],
        &["exec", "--json", &name, "--", "echo", "hi"],
        &["build", "--progress", "plain", &ctx_arg],
    ];
    for args in cases {
        let (r, w) = rustix::pipe::pipe().expect("pipe");
        drop(r);
        let out = std::process::Command::new(harness::sifbox_bin())
            .args(args)
            .env("SIFBOX_RUNTIME", sb.runtime())
            .env("SIFBOX_CACHE", store.path())
            .env("TMPDIR", tmp.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::from(w))
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("running sifbox");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("tmp")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{args:?} left {left:?} in TMPDIR");
    }
    sb.cmd(["stop", "--timeout", "0", &name]).output().success();
    sb.assert_clean();
}

/// One exit-code table: `sifbox --help` prints it, and README has the same
/// rows (checked here, so the two cannot drift apart).
#[test]
fn the_exit_code_table_is_in_help_and_readme() {
    let sb = Sifbox::new();
    let help = sb.cmd(["--help"]).output();
    help.success();
    // As the unprivileged user the checkout may be out of reach (under
    // /root): the root run checks README.
    let readme = match std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    ) {
        Ok(text) => text,
        Err(e) if !harness::is_root() => {
            eprintln!("README.md not readable here ({e}): checking --help only");
            String::new()
        }
        Err(e) => panic!("README.md: {e}"),
    };
    assert!(help.stdout.contains("Exit status:"), "{}", help.stdout);
    for (cmd_help, cmd_readme, codes) in [
        (
            "run, exec, wait",
            "| `run`, `exec`, `wait` |",
            &["124", "126", "127", "128+N", "137"][..],
        ),
        (
            "build",
            "| `build` |",
            &["0 built", "1 a build step", "125 every other error"][..],
        ),
        (
            "eval",
            "| `eval` |",
            &[
                "0 every rollout ran",
                "1 a rollout hit",
                "125 bad input",
                "130",
            ][..],
        ),
        ("doctor", "| `doctor` |", &["1 a check says FAIL"][..]),
        ("every command", "| every command |", &["125"][..]),
    ] {
        let h = help
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("Exit status:"))
            .skip_while(|l| !l.trim_start().starts_with(cmd_help))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        let r = if readme.is_empty() {
            None
        } else {
            Some(
                readme
                    .lines()
                    .find(|l| l.starts_with(cmd_readme))
                    .unwrap_or_else(|| panic!("README has no exit-status row {cmd_readme}")),
            )
        };
        for c in codes {
            assert!(h.contains(c), "help's {cmd_help}: no {c}: {h}");
            if let Some(r) = r {
                assert!(r.contains(c), "README's {cmd_readme}: no {c}: {r}");
            }
        }
    }
    // `run --help` has it too.
    let run = sb.cmd(["run", "--help"]).output();
    assert!(run.stdout.contains("Exit status:"), "{}", run.stdout);
}

// ===========================================================================
// 16. Flags as users expect them (issue 15)
// ===========================================================================

/// `run` takes Docker's spellings: `-i` (run hands stdin to the command
/// anyway), `--rm` (run always removes its sandbox), and `-i` with `-t`
/// as one word, either way round.
#[test]
fn run_takes_dockers_interactive_tty_and_rm() {
    let sb = Sifbox::new();
    for flags in [
        &["-i"][..],
        &["--interactive"],
        &["-it"],
        &["-ti"],
        &["--rm", "-it"],
        &["--rm", "-i", "-t"],
    ] {
        let mut args = flags.to_vec();
        args.push("cat");
        let out = sb.run(&args).stdin(b"hi\n").output();
        out.success();
        assert_eq!(out.stdout, "hi\n", "run {flags:?} cat");
    }
    sb.run(["--rm", "true"]).output().code_is(0);
    sb.run(["--rm", "sh", "-c", "exit 3"]).output().code_is(3);
    // With a terminal, -it gives the command a pty (util-linux's script
    // provides the terminal).
    let inner = format!(
        "{} run --rm --rootfs {} -it -- sh -c 'tty; exit 7'",
        harness::sifbox_bin().display(),
        rootfs().display()
    );
    let out = sb
        .program("script", ["-q", "-e", "-c", inner.as_str(), "/dev/null"])
        .output();
    out.code_is(7);
    assert!(out.stdout.contains("/dev/pts/0"), "tty: {:?}", out.stdout);
    // Help says what they do.
    let help = sb.cmd(["run", "--help"]).output();
    help.success();
    for flag in ["-i, --interactive", "--rm", "-t, --tty"] {
        assert!(help.stdout.contains(flag), "run --help: no {flag}");
    }
    assert!(
        help.stdout.contains("changes nothing"),
        "run --help does not say -i and --rm are no-ops: {}",
        help.stdout
    );
}

/// `start` cannot do without `--name`: its help and usage say so, and
/// clap refuses a start without one.
#[test]
fn start_says_that_name_is_required() {
    let sb = Sifbox::new();
    for args in [&["start", "--help"][..], &["help", "start"]] {
        let help = sb.cmd(args).output();
        help.success();
        let usage = help
            .stdout
            .lines()
            .find(|l| l.starts_with("Usage:"))
            .unwrap_or_else(|| panic!("{args:?}: no usage line: {}", help.stdout));
        assert!(
            usage.contains(" --name <NAME>") && !usage.contains("[--name"),
            "{args:?}: the usage does not require --name: {usage}"
        );
        assert!(
            help.stdout.contains("Sandbox name (required)"),
            "{args:?}: {}",
            help.stdout
        );
    }
    let root = rootfs().display().to_string();
    sb.cmd(["start", "--rootfs", &root])
        .output()
        .usage_error()
        .stderr_has("--name <NAME>");
}

/// `sifbox completions SHELL` prints a completion script made from the
/// command definitions: bash loads it and completes subcommands and
/// flags with it. `sifbox man [SUBCOMMAND]` prints a man page that groff
/// renders without a warning. A shell or subcommand sifbox does not know
/// is an error (125).
#[test]
fn completions_and_man_pages_are_generated() {
    let sb = Sifbox::new();
    let bin = harness::sifbox_bin().display().to_string();
    let script = format!(
        "source <({bin} completions bash) && complete -p sifbox && \
         COMP_WORDS=(sifbox ru); COMP_CWORD=1; _sifbox sifbox ru sifbox; echo \"[${{COMPREPLY[*]}}]\"; \
         COMP_WORDS=(sifbox cp --fo); COMP_CWORD=2; _sifbox sifbox --fo cp; echo \"[${{COMPREPLY[*]}}]\""
    );
    let out = sb.program("/bin/bash", ["-c", script.as_str()]).output();
    out.success();
    assert!(
        out.stdout.contains("-F _sifbox") && out.stdout.contains("sifbox\n"),
        "complete -p: {}",
        out.stdout
    );
    assert!(out.stdout.contains("[run]"), "ru<TAB>: {}", out.stdout);
    assert!(
        out.stdout.contains("--follow-link"),
        "cp --fo<TAB>: {}",
        out.stdout
    );
    for (shell, has) in [
        ("zsh", "#compdef sifbox"),
        ("fish", "complete -c sifbox"),
        ("elvish", "sifbox"),
        ("powershell", "sifbox"),
    ] {
        let out = sb.cmd(["completions", shell]).output();
        out.success();
        assert!(
            out.stdout.contains(has),
            "completions {shell}: {}",
            out.stdout
        );
        assert!(
            out.stdout.contains("rootfs"),
            "completions {shell}: no --rootfs"
        );
    }
    sb.cmd(["completions", "tcsh"])
        .output()
        .usage_error()
        .stderr_has("tcsh");
    sb.cmd(["completions"]).output().usage_error();

    let groff = harness::require("groff", "groff-base");
    let groff = groff.display();
    for (args, title, has) in [
        ("", "sifbox", "Exit status"),
        ("run", "sifbox-run", "--rootfs"),
        ("image ls", "sifbox-image-ls", "--json"),
    ] {
        let out = sb.cmd(format!("man {args}").split_whitespace()).output();
        out.success();
        assert!(
            out.stdout.contains(&format!(".TH {title} 1")),
            "man {args}: {}",
            out.stdout
        );
        let rendered = sb
            .program(
                "/bin/sh",
                [
                    "-c",
                    format!("{bin} man {args} | {groff} -man -Tutf8 -ww -P-c -P-b -P-u").as_str(),
                ],
            )
            .output();
        rendered.success();
        assert!(
            rendered.stderr.is_empty(),
            "groff warns about man {args}: {}",
            rendered.stderr
        );
        assert!(
            rendered.stdout.contains(has) && rendered.stdout.contains("SYNOPSIS"),
            "man {args} rendered: {}",
            rendered.stdout
        );
    }
    sb.cmd(["man", "bogus"])
        .output()
        .sifbox_error()
        .stderr_has("bogus");
}

/// Every `--flag` that `sifbox doctor` recommends, in what it prints on
/// this host, is one the subcommand it names has (checked against that
/// subcommand's --help); a flag with no command named before it is
/// refused, as a reader could not tell where it goes. Flags of other
/// programs (`systemd-run --user`, `usermod --add-subuids`, `docker run
/// --security-opt`, a `{path} --version`) are not sifbox's.
#[test]
fn doctor_recommends_only_flags_that_exist() {
    let sb = Sifbox::new();
    let report = sb.cmd(["doctor", "--json"]).output();
    report.success();
    let report = report.json();
    let mut texts = Vec::new();
    for c in report["checks"].as_array().expect("checks") {
        for k in ["detail", "fix"] {
            if let Some(t) = c[k].as_str() {
                texts.push(t.to_string());
            }
        }
    }
    let top = sb.cmd(["--help"]).output();
    top.success();
    let subcommands: Vec<String> = top
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(subcommands.contains(&"run".to_string()), "{subcommands:?}");
    let foreign = [
        "systemd-run",
        "usermod",
        "docker",
        "apptainer",
        "singularity",
    ];
    let mut bad = Vec::new();
    let mut checked = 0;
    for text in &texts {
        let words: Vec<&str> = text
            .split_whitespace()
            .map(|w| w.trim_matches(|c: char| "`()[],;:.\"'".contains(c)))
            .collect();
        // None: no program yet; Some(None): another program's; Some(Some(SUB)).
        let mut program: Option<Option<String>> = None;
        for (i, w) in words.iter().enumerate() {
            if *w == "sifbox" {
                let sub = words
                    .get(i + 1)
                    .filter(|s| subcommands.iter().any(|c| c == *s))
                    .map(|s| s.to_string());
                program = Some(sub);
            } else if foreign.contains(w) || w.starts_with('/') || w.starts_with('{') {
                program = Some(None);
            } else if let Some(flag) = w.strip_prefix("--") {
                let flag: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if flag.is_empty() {
                    continue;
                }
                match &program {
                    None => bad.push(format!("--{flag} names no command, in {text:?}")),
                    Some(None) => {}
                    Some(Some(sub)) => {
                        checked += 1;
                        let help = sb.cmd([sub.as_str(), "--help"]).output();
                        help.success();
                        if !help.stdout.contains(&format!("--{flag}")) {
                            bad.push(format!("sifbox {sub} has no --{flag}, in {text:?}"));
                        }
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "doctor recommends:\n  {}", bad.join("\n  "));
    eprintln!("{checked} sifbox flags in doctor's advice, all there");
}

/// `--timeout` in `run` as in `exec`: the command and every process it
/// started are killed, the exit is 124, and one line on stderr says why
/// (issue 26: `exec --timeout` was silent and `run` had no --timeout).
#[test]
fn timeouts_in_run_and_exec_kill_the_command_and_say_so() {
    let sb = Sifbox::new();
    let m = unique_number();
    let script = format!("echo before; setsid sh -c 'sleep {m}' & sleep {m}");
    let out = sb
        .run(["--timeout", "1", "--", "sh", "-c", &script])
        .timeout(Duration::from_secs(60))
        .output();
    out.code_is(124);
    assert_eq!(out.stdout, "before\n", "{out:?}");
    out.stderr_has("ran past its --timeout");
    assert!(
        processes_with_arg(&m.to_string()).is_empty(),
        "a process of the timed-out run is left"
    );
    // A bad limit is bad input, before anything is started.
    sb.run(["--timeout", "0", "--", "true"])
        .output()
        .code_is(125)
        .stderr_has("--timeout");
    let sandbox = Started::plain(&sb, "timeout-line");
    let out = sandbox.exec(&["--timeout", "0.5"], &["sleep", "30"]);
    out.code_is(124);
    out.stderr_has("ran past its --timeout");
    // In time: no line.
    let out = sandbox.exec(&["--timeout", "30"], &["true"]);
    out.code_is(0);
    assert!(!out.stderr.contains("--timeout"), "{out:?}");
}

/// A misspelt flag gets clap's error with a usage line that shows what the
/// command needs, not the flags clap guessed at (issue 26: `run --bogus`
/// printed `Usage: sifbox run --logs <DIR> ...`, as if --logs were required).
#[test]
fn a_misspelt_flag_shows_the_commands_real_usage() {
    let sb = Sifbox::new();
    for (cmd, usage) in [
        (
            "run",
            "Usage: sifbox run [OPTIONS] (--rootfs DIR | IMAGE) [--] [ARGS...]",
        ),
        (
            "start",
            "Usage: sifbox start [OPTIONS] --name <NAME> (--rootfs DIR | IMAGE)",
        ),
    ] {
        let out = sb.cmd([cmd, "--bogus"]).output();
        out.code_is(125).stderr_has("--bogus").stderr_has(usage);
        assert!(!out.stderr.contains("--logs <DIR>"), "{cmd}: {out:?}");
    }
}
