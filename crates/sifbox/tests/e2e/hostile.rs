//! The hostile suite (issue 12): what a command inside a sandbox, running
//! as root there and knowing sifbox's source, would try against the host,
//! each attempt a test that failed on the main branch before the defence
//! and must stay contained.
//!
//! The attacks do no harm when they succeed: they aim at decoy files and
//! dirs this test makes, write host-wide settings back with the value they
//! have, and never touch a real host file. Most attempts run inside the
//! sandbox as modes of the probe (`sifbox-probe attack NAME...`, see
//! crates/sifbox-probe/src/attack.rs), which reports each one as contained
//! or not; the rest are driven from here. Like every end-to-end suite they
//! run as root and as the unprivileged user (scripts/test.sh).
//!
//! Sections:
//!  1. the supervisor (fds, memory, ptrace, pidfd_getfd, the caller's stdio)
//!  2. images that would steer root assembly (/proc, /dev, /sys symlinks)
//!  3. host state (keyrings, tmpfs sizes, mountinfo, disk layers)
//!  4. the kernel's attack surface (the seccomp policy)
//!  5. build steps
//!  6. tar streams that `sifbox cp -` unpacks

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{
    self, copy_rootfs, rootfs, sifbox_bin, snapshot, snapshot_diff, tempdir, unique, Output,
    Sifbox, Started, Store, Tarball,
};

// ===========================================================================
// Helpers
// ===========================================================================

/// A decoy: a dir with a secret file, readable by this test's user, that
/// an attack would reach; its snapshot tells whether anything changed.
struct Decoy {
    dir: tempfile::TempDir,
    secret: String,
}

impl Decoy {
    fn new() -> Decoy {
        let dir = tempdir("sifbox-decoy.");
        let secret = unique("decoy-secret");
        std::fs::write(dir.path().join("secret"), &secret).expect("writing the decoy");
        Decoy { dir, secret }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Runs `sh -c SCRIPT` on the host with this test's runtime dir; the
/// script can open descriptors (`9<DIR`) before it execs sifbox.
fn host_sh(sb: &Sifbox, script: &str) -> Output {
    sb.program("/bin/sh", ["-c", script]).output()
}

/// [`host_sh`] for a script that leaves a sandbox running.
fn host_sh_starting(sb: &Sifbox, script: &str) -> Output {
    sb.program("/bin/sh", ["-c", script])
        .no_clean_check()
        .output()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn bin() -> String {
    shell_quote(&sifbox_bin().display().to_string())
}

fn root_arg() -> String {
    shell_quote(&rootfs().display().to_string())
}

/// The attacks of a probe report, as (name, contained, detail).
fn attacks(report: &Value) -> Vec<(String, bool, String)> {
    report["attacks"]
        .as_object()
        .unwrap_or_else(|| panic!("no attacks in the report: {report}"))
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v["contained"].as_bool().unwrap_or(false),
                v["detail"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Asserts that every attack of the report was contained.
#[track_caller]
fn assert_contained(report: &Value) {
    let escaped: Vec<String> = attacks(report)
        .into_iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(n, _, d)| format!("{n}: {d}"))
        .collect();
    assert!(
        escaped.is_empty(),
        "attacks that got through:\n{}",
        escaped.join("\n")
    );
}

/// `sifbox start` through a shell that holds `9<decoy` open (and any
/// further `redirects`), so the supervisor is forked with them.
fn start_with_fds<'a>(sb: &'a Sifbox, decoy: &Decoy, opts: &str) -> Started<'a> {
    let name = unique("hostile");
    host_sh_starting(
        sb,
        &format!(
            "exec {} start --rootfs {} --name {name} {opts} 9<{}",
            bin(),
            root_arg(),
            shell_quote(&decoy.path().display().to_string())
        ),
    )
    .success();
    Started::adopt(sb, name)
}

// ===========================================================================
// 1. The supervisor
// ===========================================================================

const SUPERVISOR_ATTACKS: &[&str] = &[
    "supervisor-fds",
    "supervisor-mem",
    "supervisor-environ",
    "supervisor-pidfd-getfd",
    "supervisor-ptrace",
];

/// A one-shot run whose caller holds a directory open as fd 9: nothing of
/// sifbox's inside (init runs the command) lets the command read that fd,
/// its memory or its other fds (the audit read the host's files through
/// /proc/1/fd/9).
#[test]
fn the_supervisor_of_a_run_is_out_of_reach() {
    let sb = Sifbox::new();
    let decoy = Decoy::new();
    let out = host_sh(
        &sb,
        &format!(
            "exec {} run --rootfs {} -- sifbox-probe attack {} 9<{}",
            bin(),
            root_arg(),
            SUPERVISOR_ATTACKS.join(" "),
            shell_quote(&decoy.path().display().to_string())
        ),
    );
    out.success();
    assert_contained(&out.json());
    assert!(!out.stdout.contains(&decoy.secret));
}

/// The same for a long-lived sandbox (init and its exec worker), with the
/// command as root, as a user of the image and under a timeout. (The
/// one-off exec process of a fake-ids build step is the build test's.)
/// With a memory limit, so that without a cgroup init also holds the
/// watchdog's idle pipe.
#[test]
fn the_supervisor_and_workers_of_a_started_sandbox_are_out_of_reach() {
    let sb = Sifbox::new();
    let decoy = Decoy::new();
    let started = start_with_fds(&sb, &decoy, "--memory 1g");
    // A secret that travels with an exec: the attack would read it from
    // the next request.
    let secret = unique("api-key");
    for extra in [&[][..], &["-u", "1000"][..], &["--timeout", "30"][..]] {
        let mut args = vec!["exec", "-e", "API_KEY"];
        args.extend_from_slice(extra);
        args.extend([started.name.as_str(), "--", "sifbox-probe", "attack"]);
        args.extend_from_slice(SUPERVISOR_ATTACKS);
        let out = sb
            .cmd(&args)
            .env("API_KEY", &secret)
            .no_clean_check()
            .output();
        out.success();
        assert_contained(&out.json());
        assert!(!out.stdout.contains(&decoy.secret));
    }
}

/// The caller's stderr (a terminal, a log file) is not reachable through
/// init's /proc/1/fd/2: a command can neither read nor append to it (its
/// own stderr, the caller's by design, is pointed elsewhere first).
#[test]
fn the_callers_stderr_is_out_of_reach() {
    let sb = Sifbox::new();
    let decoy = Decoy::new();
    let log = decoy.path().join("caller-stderr.log");
    std::fs::write(&log, "before\n").expect("log");
    let marker = unique("appended");
    let out = host_sh(
        &sb,
        &format!(
            "{} run --rootfs {} -- sh -c 'exec 2>/dev/null; echo {marker} >> /proc/1/fd/2; cat /proc/1/fd/2; true' 2>>{}",
            bin(),
            root_arg(),
            shell_quote(&log.display().to_string())
        ),
    );
    out.success();
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        !text.contains(&marker),
        "the command appended to the caller's stderr: {text}"
    );
    assert!(
        !out.stdout.contains("before"),
        "the command read the caller's stderr"
    );
}

/// A pipe the caller of `sifbox start` passed (any fd, here 5) reaches EOF
/// as soon as start returns: no process of the sandbox holds it (the audit
/// found a reader hanging until `stop`).
#[test]
fn a_pipe_given_to_start_is_not_held_by_the_sandbox() {
    let sb = Sifbox::new();
    let name = unique("pipe");
    let t = Instant::now();
    // The shell's stdout is our pipe; `start` gets it as fd 5 (and as
    // stdout); `cat` sees EOF only once nothing holds it.
    let out = host_sh_starting(
        &sb,
        &format!(
            "( {} start --rootfs {} --name {name} 5>&1 >/dev/null; echo started ) | cat",
            bin(),
            root_arg(),
        ),
    );
    let took = t.elapsed();
    sb.cmd(["stop", "--timeout", "1", &name]).output().success();
    out.success();
    assert!(out.stdout.contains("started"), "{}", out.stdout);
    assert!(
        took < Duration::from_secs(20),
        "the pipe was held for {took:?}"
    );
}

// ===========================================================================
// 2. Images that would steer root assembly
// ===========================================================================

/// A copy of the test rootfs with `path` replaced by a symlink to
/// `target` (or by an empty file when `target` is None).
fn crafted_rootfs(dir: &Path, path: &str, target: Option<&Path>) -> PathBuf {
    let root = dir.join("root");
    copy_rootfs(&root);
    let p = root.join(path);
    if p.is_dir() {
        std::fs::remove_dir_all(&p).expect("rm");
    } else {
        let _ = std::fs::remove_file(&p);
    }
    match target {
        Some(t) => std::os::unix::fs::symlink(t, &p).expect("symlink"),
        None => std::fs::write(&p, b"").expect("file"),
    }
    root
}

/// Starting `image` fails with one clear error naming `path`, leaves
/// nothing behind, and does not touch the decoy.
#[track_caller]
fn refused(sb: &Sifbox, image: &Path, path: &str, decoy: &Decoy) {
    let before = snapshot(decoy.path());
    // A store of its own (a SIF is imported into it).
    let cache = tempdir("sifbox-crafted-store.");
    let out = sb
        .cmd(["run", &image.display().to_string(), "true"])
        .env("SIFBOX_CACHE", cache.path())
        .output();
    out.sifbox_error();
    out.stderr_has(&format!("the image's {path}"));
    let diff = snapshot_diff(&before, &snapshot(decoy.path()));
    assert!(diff.is_empty(), "the decoy changed:\n{diff}");
    harness::make_removable(cache.path());
}

/// The test rootfs with `path` replaced (see [`crafted_rootfs`]) is
/// refused with `why`, as a rootfs dir and, with `sif`, as a foreign SIF.
#[track_caller]
fn crafted_is_refused(path: &str, target: Option<&Path>, why: &str, sif: bool) {
    let sb = Sifbox::new();
    let decoy = Decoy::new();
    let dir = tempdir("sifbox-crafted.");
    let target = target.map(|t| {
        if t.as_os_str().is_empty() {
            decoy.path().to_path_buf()
        } else {
            t.to_path_buf()
        }
    });
    let root = crafted_rootfs(dir.path(), path, target.as_deref());
    let what = format!("/{path} {why}");
    refused(&sb, &root, &what, &decoy);
    if sif {
        refused(&sb, &harness::foreign_sif(&root, dir.path()), &what, &decoy);
    }
    for node in ["null", "zero", "tty"] {
        assert!(
            !decoy.path().join(node).exists(),
            "{node} made in the decoy"
        );
    }
}

/// An image whose /proc is an absolute symlink (the audit mounted proc
/// through it while the read-only covers were skipped: /proc/sys became
/// writable) is refused, as a rootfs dir and as a foreign SIF. (An empty
/// target stands for the decoy dir.)
#[test]
fn an_image_with_a_symlinked_proc_is_refused() {
    crafted_is_refused("proc", Some(Path::new("")), "is a symbolic link", true);
}

/// An image whose /dev is an absolute symlink (the audit had the
/// supervisor create and truncate null, zero, tty... in that host dir) is
/// refused; so is a /dev that is a file, and a /sys that climbs out.
#[test]
fn an_image_with_a_symlinked_dev_or_sys_is_refused() {
    crafted_is_refused("dev", Some(Path::new("")), "is a symbolic link", true);
    crafted_is_refused("dev", None, "is not a directory", false);
    crafted_is_refused(
        "sys",
        Some(Path::new("../../../../../../../tmp")),
        "is a symbolic link",
        false,
    );
}

/// Host-wide knobs stay read-only, also for a sandbox of host root (whose
/// root is host uid 0: a writable core_pattern would run code as host
/// root), and the covers can neither be remounted nor unmounted.
#[test]
fn host_wide_knobs_stay_read_only() {
    let sb = Sifbox::new();
    let out = sb
        .run([
            "--",
            "sifbox-probe",
            "attack",
            "proc-sys-write",
            "proc-sysrq",
            "proc-masked",
            "remount",
            "unmount-covers",
            "mount-new",
        ])
        .output();
    out.success();
    assert_contained(&out.json());
}

// ===========================================================================
// 3. Host state
// ===========================================================================

/// The host's session keyring id, from the probe run on the host.
fn host_keyring_id() -> Option<String> {
    let probe = rootfs().join("usr/bin/sifbox-probe");
    let out = Command::new(&probe)
        .args(["attack", "keyring"])
        .output()
        .expect("running the probe on the host");
    let report: Value = serde_json::from_slice(&out.stdout).expect("probe report");
    let detail = report["attacks"]["keyring"]["detail"].as_str()?.to_string();
    detail.strip_prefix("session keyring ").map(str::to_string)
}

/// The caller's session keyring (an ssh login's keys) is not the
/// sandbox's: the default policy denies keyctl outright, and without any
/// filter the command finds a fresh keyring of the sandbox's own.
#[test]
fn the_callers_session_keyring_is_not_shared() {
    let sb = Sifbox::new();
    let out = sb.run(["--", "sifbox-probe", "attack", "keyring"]).output();
    out.success();
    assert_contained(&out.json());
    let out = sb
        .run([
            "--seccomp",
            "unconfined",
            "--",
            "sifbox-probe",
            "attack",
            "keyring",
        ])
        .output();
    out.success();
    let inside = out.json()["attacks"]["keyring"]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(host) = host_keyring_id() {
        assert!(
            !inside.ends_with(&format!(" {host}")),
            "the sandbox sees the caller's session keyring {host}: {inside}"
        );
    }
}

/// /dev/shm has a size (64 MiB by default, --shm-size), /tmp is part of
/// the writable layer and bounded by --tmpfs-size (the audit found both
/// unbounded RAM tmpfs, 12 GiB each).
#[test]
fn tmpfs_mounts_have_sizes() {
    let sb = Sifbox::new();
    let kib = |out: &Output, mount: &str| -> u64 {
        out.stdout
            .lines()
            .find(|l| l.split_whitespace().last() == Some(mount))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no size of {mount} in {}", out.stdout))
    };
    let out = sb.run(["--", "df", "-k", "/dev/shm"]).output();
    out.success();
    assert_eq!(kib(&out, "/dev/shm"), 64 * 1024);
    let out = sb
        .run(["--shm-size", "8m", "--", "df", "-k", "/dev/shm"])
        .output();
    out.success();
    assert_eq!(kib(&out, "/dev/shm"), 8 * 1024);
    // Writing 32 MiB into /tmp of a 16 MiB writable layer fails.
    let out = sb
        .run([
            "--tmpfs-size",
            "16",
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/tmp/fill bs=1048576 count=32 2>&1; echo rc=$?",
        ])
        .output();
    out.success();
    assert!(out.stdout.contains("No space left"), "{}", out.stdout);
    assert!(!out.stdout.contains("rc=0"), "{}", out.stdout);
    // Bad sizes are bad input.
    sb.run(["--shm-size", "lots", "--", "true"])
        .output()
        .usage_error();
}

/// No host path of the image's layers, the writable layer or the runtime
/// dir shows in the sandbox's mountinfo (the audit read the overlay's
/// lower and upper host paths there).
#[test]
fn mountinfo_shows_no_host_paths() {
    let sb = Sifbox::new();
    let out = sb.run(["--", "cat", "/proc/self/mountinfo"]).output();
    out.success();
    let image = rootfs().display().to_string();
    let runtime = sb.runtime().display().to_string();
    for line in out.stdout.lines() {
        assert!(
            !line.contains(&image),
            "the image's host path shows: {line}"
        );
        assert!(!line.contains(&runtime), "the runtime dir shows: {line}");
    }
}

/// A disk-backed layer (host root only) is a copy of an ext4 template in
/// the scratch dir: root inside, knowing that, finds no path to the
/// template or the scratch dir, cannot make or open a loop device to write
/// the file system under it, and what it writes and syncs on its layer is
/// in no later sandbox and leaves the template's bytes as they were. As
/// another user there is no disk layer (refused, exit 125) and no template.
#[test]
fn a_disk_layers_template_and_device_are_out_of_reach() {
    let sb = Sifbox::new();
    let scratch = tempdir("sifbox-hostile-scratch.");
    let sp = scratch.path().display().to_string();
    let image = rootfs().display().to_string();
    let run = |script: &str| {
        sb.cmd([
            "run", "--rootfs", &image, "--disk", "64m", "--", "sh", "-c", script,
        ])
        .env("SIFBOX_SCRATCH", scratch.path())
        .timeout(Duration::from_secs(60))
        .output()
    };
    if !harness::disk_layers() {
        run("true").sifbox_error();
        assert_eq!(
            crate::limits::template_names(scratch.path()),
            Vec::<String>::new()
        );
        sb.assert_clean();
        return;
    }
    // Made by a first sandbox.
    run("true").success();
    let templates = crate::limits::template_names(scratch.path());
    assert_eq!(templates.len(), 1, "{templates:?}");
    let template = scratch.path().join(&templates[0]);
    let before = std::fs::read(&template).expect("template");
    let attack = format!(
        "for n in 0 1 2 3 4 5 6 7; do \
           mknod /tmp/loop$n b 7 $n 2>/dev/null && dd if=/dev/zero of=/tmp/loop$n bs=4096 count=1 2>/dev/null && echo WROTE-DEVICE$n; \
           [ -b /dev/loop$n ] && echo LOOP-NODE$n; \
         done; \
         grep -c '{sp}' /proc/self/mountinfo; \
         find / -xdev -name '.ext4-template-*' 2>/dev/null | grep -q . && echo FOUND-TEMPLATE; \
         echo planted > /planted; dd if=/dev/urandom of=/bulk bs=65536 count=64 2>/dev/null; sync; echo done"
    );
    let out = run(&attack);
    out.success();
    assert!(out.stdout.contains("done"), "{}", out.stdout);
    for bad in ["WROTE-DEVICE", "LOOP-NODE", "FOUND-TEMPLATE"] {
        assert!(!out.stdout.contains(bad), "{bad}: {}", out.stdout);
    }
    assert!(
        out.stdout.lines().any(|l| l.trim() == "0"),
        "the scratch dir shows in mountinfo: {}",
        out.stdout
    );
    assert_eq!(
        std::fs::read(&template).expect("template"),
        before,
        "the template changed"
    );
    let out = run("ls /planted /bulk 2>&1; true");
    out.success();
    assert!(out.stdout.contains("No such file"), "{}", out.stdout);
    assert!(!out.stdout.contains("/bulk\n"), "{}", out.stdout);
    assert_eq!(crate::limits::template_names(scratch.path()), templates);
    assert!(crate::limits::loops_backed_in(scratch.path()).is_empty());
    sb.assert_clean();
}

/// An eval worker's sandboxes take turns on its disk-backed file systems,
/// each in a fresh directory: root inside, which leaves all it can for the
/// next rollout (files, a deep tree with closed modes, a fifo, hard links,
/// symlinks to a host directory, most of the file system filled (the
/// verifier's upload needs some room), a process that
/// holds a file open), finds none of it in the next one, and gets the whole
/// size again; the removal follows none of the symlinks (the host
/// directory they name is whole after). Four rollouts used fewer loop
/// devices than four (a worker keeps up to three file systems of a size,
/// each free again once the reaper removed its last directory; without
/// reuse each rollout has its own). As another user the layers are tmpfs.
#[test]
fn a_reused_disk_file_system_keeps_nothing_of_the_last_sandbox() {
    let env = crate::eval::Env::with_evalbase();
    let canary = tempdir("sifbox-hostile-canary.");
    std::fs::create_dir(canary.path().join("sub")).expect("mkdir");
    std::fs::write(canary.path().join("sub/keep"), "keep").expect("write");
    let host = canary.path().display();
    let solve = format!(
        "#!/bin/sh\n\
         for p in /planted /deep /fifo /link /hard /closed /bulk /hostdir; do \
           if [ -e $p ] || [ -L $p ]; then echo LEFT $p; fi; \
         done > /logs/agent/found\n\
         df -k / | tail -1 | awk '{{print $4}}' > /logs/agent/free\n\
         echo planted > /planted; ln /planted /hard; mkfifo /fifo\n\
         mkdir -p /deep/a/b/c/d; echo x > /deep/a/b/c/d/f; ln -s {host} /deep/a/b/c/d/out\n\
         chmod 000 /deep/a/b /deep; mkdir /closed; chmod 000 /closed\n\
         ln -s {host}/sub /link; ln -s {host} /hostdir\n\
         dd if=/dev/zero of=/bulk bs=1M count=48 2>/dev/null; sync\n\
         setsid sh -c 'exec 3</bulk; sleep 600' </dev/null >/dev/null 2>&1 &\n\
         sleep 1\n"
    );
    env.task(
        "leftovers",
        "[environment]\nstorage_mb = 64\n",
        &solve,
        "#!/bin/sh\n\
         if [ -s /logs/agent/found ]; then echo 0; else echo 1; fi > /logs/verifier/reward.txt\n",
    );
    let scratch = tempdir("sifbox-hostile-scratch.");
    let tasks = env.path("tasks").display().to_string();
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut loops = std::collections::BTreeSet::new();
    std::thread::scope(|s| {
        let job = s.spawn(|| {
            let out = env
                .eval(&["--job", "j", "--jobs", "1", "--attempts", "4", &tasks])
                .env("SIFBOX_SCRATCH", scratch.path())
                .output();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            out
        });
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            if harness::disk_layers() {
                loops.extend(crate::limits::loops_backed_in(scratch.path()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        job.join().expect("the job's thread").success();
    });
    let mut free = Vec::new();
    for n in 1..=4 {
        let rollout = format!("leftovers__{n}");
        let r = env.result("j", &rollout);
        let dir = env.out().join("j").join(&rollout);
        let found = std::fs::read_to_string(dir.join("agent/found")).expect("found");
        assert_eq!(found, "", "{rollout} found what an earlier one left");
        assert_eq!(r["reward"], 1.0, "{rollout}: {r:#}");
        let kb: u64 = std::fs::read_to_string(dir.join("agent/free"))
            .expect("free")
            .trim()
            .parse()
            .expect("df's figure");
        free.push(kb);
        let storage = crate::eval::applied(&r, "storage").expect("storage");
        let layer = if harness::disk_layers() {
            "disk"
        } else {
            "tmpfs"
        };
        assert_eq!(storage["how"], layer, "{storage}");
    }
    // Each started with the whole size (what an earlier one filled is free).
    assert!(
        free.iter()
            .all(|&kb| kb + 1024 >= free[0] && kb <= free[0] + 1024),
        "free space at the start of each rollout: {free:?}"
    );
    assert!(free[0] > 40 * 1024, "{free:?}");
    assert_eq!(
        std::fs::read_to_string(canary.path().join("sub/keep")).expect("the host's file"),
        "keep"
    );
    if harness::disk_layers() {
        assert!(loops.len() < 4, "loop devices seen: {loops:?}");
        assert!(crate::limits::loops_backed_in(scratch.path()).is_empty());
    }
}

// ===========================================================================
// 4. The kernel's attack surface
// ===========================================================================

/// The default policy denies what no ordinary program needs (keyctl, bpf,
/// userfaultfd, perf_event_open, io_uring, kexec, modules,
/// open_by_handle_at) and new user namespaces; the same calls reach the
/// kernel with --seccomp unconfined, so the policy is what stops them.
#[test]
fn the_default_seccomp_policy_denies_kernel_attack_surface() {
    let sb = Sifbox::new();
    let out = sb
        .run(["--", "sifbox-probe", "attack", "syscalls", "new-userns"])
        .output();
    out.success();
    assert_contained(&out.json());
    let out = sb
        .run([
            "--seccomp",
            "unconfined",
            "--",
            "sifbox-probe",
            "attack",
            "syscalls",
        ])
        .output();
    out.success();
    let (_, contained, detail) = attacks(&out.json()).remove(0);
    assert!(
        !contained,
        "without the filter some of these calls must reach the kernel: {detail}"
    );
}

/// `--allow-userns` lets commands make a user namespace (bubblewrap,
/// Chromium's sandbox), still under the rest of the policy.
#[test]
fn allow_userns_opts_in_to_nested_namespaces() {
    let sb = Sifbox::new();
    let out = sb
        .run([
            "--allow-userns",
            "--",
            "sifbox-probe",
            "attack",
            "new-userns",
            "syscalls",
        ])
        .output();
    out.success();
    let report = out.json();
    let by_name: Vec<(String, bool, String)> = attacks(&report);
    let userns = by_name
        .iter()
        .find(|(n, ..)| n == "new-userns")
        .expect("new-userns");
    assert!(
        !userns.1,
        "a user namespace could not be made: {}",
        userns.2
    );
    let calls = by_name
        .iter()
        .find(|(n, ..)| n == "syscalls")
        .expect("syscalls");
    assert!(calls.1, "the rest of the policy is off: {}", calls.2);
}

// ===========================================================================
// 5. Build steps
// ===========================================================================

/// A RUN step of `sifbox build` cannot read a directory its caller held
/// open (the audit read host files through /proc/1/fd/9 from a build).
#[test]
fn a_build_step_cannot_reach_the_builders_fds() {
    let store = Store::new("sifbox-hostile-build.");
    let decoy = Decoy::new();
    let ctx = tempdir("sifbox-hostile-ctx.");
    store.import(rootfs(), "busybox").output().success();
    // With the caller's whole id range, and with one id, where each step
    // runs in an exec process of its own under the fakeroot filter.
    for (i, userns) in ["auto", "single"].iter().enumerate() {
        std::fs::write(
            ctx.path().join("Dockerfile"),
            format!("FROM busybox\nRUN echo {i}; for p in /proc/[0-9]*; do cat $p/fd/9/secret; ls $p/fd/9/; done 2>/dev/null; sifbox-probe attack supervisor-fds supervisor-ptrace > /probe.json\n"),
        )
        .expect("Dockerfile");
        let out = store
            .sb
            .program(
                "/bin/sh",
                [
                    "-c",
                    &format!(
                        "exec {} build --progress plain --userns {userns} -t hostile-build:1 {} 9<{}",
                        bin(),
                        shell_quote(&ctx.path().display().to_string()),
                        shell_quote(&decoy.path().display().to_string())
                    ),
                ],
            )
            .env("SIFBOX_CACHE", store.path())
            .timeout(Duration::from_secs(120))
            .output();
        out.success();
        assert!(!out.stdout.contains(&decoy.secret) && !out.stderr.contains(&decoy.secret));
        let report = store
            .cmd(["run", "hostile-build:1", "cat", "/probe.json"])
            .output();
        report.success();
        assert_contained(&report.json());
    }
    store.empty();
    harness::make_removable(store.path());
}

/// `RUN --mount=type=bind,from=STAGE,source=/k` where STAGE made `/k` a
/// symlink to a host path (a file, and a dir mounted rw) reads and writes
/// nothing of the host: the link is followed inside the stage's tree,
/// where the path is not, so each build fails naming the source (the
/// audit's: the link was left in the downloaded copy and the bind followed
/// it on the host, as the builder). A link to a path the stage has still
/// mounts it, as BuildKit.
#[test]
fn a_build_bind_from_a_stage_follows_its_symlinks_inside_the_stage() {
    let store = Store::new("sifbox-hostile-bindfrom.");
    let decoy = Decoy::new();
    let before = snapshot(decoy.path());
    let ctx = tempdir("sifbox-hostile-bindfrom.");
    store.import(rootfs(), "busybox").output().success();
    let d = decoy.path().display();
    let ctx_arg = ctx.path().display().to_string();
    let attacks = [
        "RUN --mount=type=bind,from=s,source=/k,target=/m cat /m".to_string(),
        "RUN --mount=type=bind,from=s,source=/kd,target=/m,rw sh -c 'cat /m/secret; echo planted > /m/planted'".to_string(),
        "RUN --mount=type=bind,from=s,source=/rel,target=/m cat /m".to_string(),
    ];
    for (i, attack) in attacks.iter().enumerate() {
        std::fs::write(
            ctx.path().join("Dockerfile"),
            format!(
                "FROM busybox AS s\nRUN ln -s {d}/secret /k && ln -s {d} /kd && ln -s ../../../../../../..{d}/secret /rel\nFROM busybox\n{attack}\n"
            ),
        )
        .expect("Dockerfile");
        let out = store
            .cmd([
                "build",
                "--progress",
                "plain",
                "-t",
                &format!("bindfrom:{i}"),
                &ctx_arg,
            ])
            .timeout(Duration::from_secs(120))
            .output();
        assert!(
            !out.stdout.contains(&decoy.secret) && !out.stderr.contains(&decoy.secret),
            "{attack}: the host file was read: {out:?}"
        );
        assert_eq!(out.code(), Some(125), "{attack}: {out:?}");
        assert!(out.stderr.contains("--mount"), "{attack}: {out:?}");
    }
    assert_eq!(snapshot_diff(&before, &snapshot(decoy.path())), "");
    // A link inside the stage to its own file still mounts that file.
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM busybox AS s\nRUN echo inside > /real && ln -s /real /k\nFROM busybox\nRUN --mount=type=bind,from=s,source=/k,target=/m cat /m > /got\n",
    )
    .expect("Dockerfile");
    store
        .cmd([
            "build",
            "--progress",
            "plain",
            "-t",
            "bindfrom:ok",
            &ctx_arg,
        ])
        .timeout(Duration::from_secs(120))
        .output()
        .success();
    let got = store.cmd(["run", "bindfrom:ok", "cat", "/got"]).output();
    got.success();
    assert_eq!(got.stdout.trim(), "inside");
    store.empty();
    harness::make_removable(store.path());
}

// ===========================================================================
// 6. Tar streams that `sifbox cp -` unpacks
// ===========================================================================

/// `sifbox cp - NAME:DIR` unpacks a tar stream into DIR and nowhere else:
/// an entry that climbs out (`../`), an absolute one, one below a symlink
/// the stream made (absolute or `..`), one below a symlink the sandbox
/// planted in DIR, and a hard link to a file outside are each refused,
/// naming the entry, with exit 125. DIR is a host directory bound into
/// the sandbox, beside a decoy that each of them aims at: the decoy stays
/// as it was, and so does the sandbox's own /etc. (It failed on main,
/// where `-` was read as a host file of that name.)
#[test]
fn cp_tar_stream_stays_in_its_directory() {
    let sb = Sifbox::new();
    let host = tempdir("sifbox-cp-tar-hostile.");
    std::fs::create_dir(host.path().join("dest")).expect("mkdir");
    std::fs::create_dir(host.path().join("decoy")).expect("mkdir");
    let secret = unique("decoy-secret");
    std::fs::write(host.path().join("decoy/secret"), &secret).expect("write");
    let bind = format!("{}:/mnt/h", host.path().display());
    let sandbox = Started::new(&sb, &unique("cp-tar-hostile"), &["--bind", &bind], &[]);
    let n = &sandbox.name;
    // What the sandbox plants in the destination beforehand.
    sandbox
        .sh("ln -s /mnt/h/decoy /mnt/h/dest/planted && ln -s ../decoy /mnt/h/dest/planted-rel")
        .success();
    let before = snapshot(&host.path().join("decoy"));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "climbs out",
            Tarball::new().raw_file("../decoy/climbed", b"evil").bytes(),
            "../decoy/climbed",
        ),
        (
            "climbs to the sandbox's /etc",
            Tarball::new().raw_file("../../../etc/x", b"evil").bytes(),
            "../../../etc/x",
        ),
        (
            "climbs from below",
            Tarball::new()
                .dir("a", 0o755)
                .raw_file("a/../../decoy/below", b"evil")
                .bytes(),
            "a/../../decoy/below",
        ),
        (
            "absolute",
            Tarball::new().raw_file("/mnt/h/decoy/abs", b"evil").bytes(),
            "/mnt/h/decoy/abs",
        ),
        (
            "absolute /etc",
            Tarball::new().raw_file("/etc/x", b"evil").bytes(),
            "/etc/x",
        ),
        (
            "below an absolute symlink of the stream",
            Tarball::new()
                .symlink("esc", "/mnt/h/decoy")
                .file("esc/pwned", 0o644, b"evil")
                .bytes(),
            "esc/pwned",
        ),
        (
            "below a .. symlink of the stream",
            Tarball::new()
                .symlink("up", "..")
                .file("up/decoy/pwned", 0o4755, b"evil")
                .bytes(),
            "up/decoy/pwned",
        ),
        (
            "a file over a symlink of the stream, then a dir through it",
            Tarball::new()
                .dir("d", 0o755)
                .symlink("d", "/mnt/h/decoy")
                .file("d/pwned", 0o644, b"evil")
                .bytes(),
            "d",
        ),
        (
            "below a symlink the sandbox planted",
            Tarball::new().file("planted/pwned", 0o644, b"evil").bytes(),
            "planted/pwned",
        ),
        (
            "below a relative symlink the sandbox planted",
            Tarball::new().dir("planted-rel", 0o777).bytes(),
            "planted-rel",
        ),
        (
            "a hard link out",
            Tarball::new().hardlink("h", "../decoy/secret").bytes(),
            "h",
        ),
        (
            "a hard link to an absolute path",
            Tarball::new().hardlink("h2", "/mnt/h/decoy/secret").bytes(),
            "h2",
        ),
    ];
    for (what, stream, entry) in &cases {
        let out = sandbox
            .cmd(&["cp", "-", &format!("{n}:/mnt/h/dest")])
            .stdin(stream)
            .output();
        out.sifbox_error()
            .stderr_has(&format!("archive entry {entry}"));
        let after = snapshot(&host.path().join("decoy"));
        assert!(
            before == after,
            "{what}: the decoy changed: {}",
            snapshot_diff(&before, &after)
        );
        assert_eq!(
            std::fs::read_to_string(host.path().join("decoy/secret")).expect("read"),
            secret,
            "{what}"
        );
        sandbox
            .sh("test ! -e /etc/x && test ! -e /mnt/h/x && test ! -e /x")
            .success();
    }
    // Nothing outside dest on the host either, and the planted links are
    // still links (never followed, never replaced by a directory).
    let names: Vec<_> = std::fs::read_dir(host.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["decoy", "dest"], "beside dest");
    for l in ["planted", "planted-rel"] {
        let md = std::fs::symlink_metadata(host.path().join("dest").join(l)).expect(l);
        assert!(md.file_type().is_symlink(), "{l} is no longer a symlink");
    }
    sandbox.stop();
    sb.assert_clean();
}

/// A command that stops (SIGSTOP) the worker process serving it, once or
/// in a loop, cannot outlive its time limit: init, which no signal from
/// inside reaches, kills it and lets the worker report the timeout (124).
/// Before, the client waited for ever, and an eval's agent ran unbounded.
#[test]
fn a_command_that_stops_its_worker_still_ends_at_its_time_limit() {
    let sb = Sifbox::new();
    let sandbox = Started::plain(&sb, "stopw");
    for script in [
        "kill -STOP $PPID; sleep 1000",
        "while :; do kill -STOP $PPID; done",
    ] {
        let t = Instant::now();
        let out = sandbox
            .exec_cmd(&["--timeout", "1"], &["sh", "-c", script])
            .timeout(Duration::from_secs(30))
            .output();
        out.code_is(124);
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{script}: {:?}",
            t.elapsed()
        );
    }
    // Nothing of them is left, and the sandbox serves on.
    let out = sandbox.exec(&[], &["ps", "-o", "pid,ppid,stat,comm"]);
    assert!(
        !out.stdout.contains("sleep") && !out.stdout.contains(" sh"),
        "{out:?}"
    );
    sandbox.sh("echo on").success();
    sandbox.stop();
    sb.assert_clean();
}

/// A process that stops the sandbox's idle worker does not make the next
/// request (a copy here) wait for ever: init lets a worker go on before it
/// hands it a request.
#[test]
fn a_stopped_idle_worker_still_serves_the_next_request() {
    let sb = Sifbox::new();
    let sandbox = Started::plain(&sb, "stopi");
    // W1 serves a detached exec; W2 serves `touch /tmp/go` and is idle a
    // second later, when the detached exec stops every sifbox process but
    // init and W1, and counts them.
    sandbox.sh("true").success();
    let script = "while [ ! -e /tmp/go ]; do sleep 0.05; done; sleep 1; n=0; \
                  for d in /proc/[0-9]*; do p=${d#/proc/}; \
                  [ \"$p\" = 1 ] || [ \"$p\" = \"$PPID\" ] && continue; \
                  [ \"$(cat $d/comm 2>/dev/null)\" = sifbox ] && kill -STOP $p && n=$((n+1)); \
                  done; echo $n > /tmp/stopped; sleep 1000";
    sandbox.exec(&["-d"], &["sh", "-c", script]).success();
    sandbox.sh("touch /tmp/go").success();
    std::thread::sleep(Duration::from_millis(2500));
    let dest = tempdir("stopi-cp");
    let t = Instant::now();
    let out = sandbox
        .cmd(&[
            "cp",
            &format!("{}:/tmp/stopped", sandbox.name),
            &dest.path().to_string_lossy(),
        ])
        .timeout(Duration::from_secs(30))
        .output();
    out.success();
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    let stopped = std::fs::read_to_string(dest.path().join("stopped")).expect("stopped");
    assert_eq!(
        stopped.trim(),
        "1",
        "the idle worker was not the one stopped"
    );
    sandbox.stop();
    sb.assert_clean();
}

/// The cgroups a sandbox with nested namespaces could make below its own
/// (a cgroup namespace, a cgroup file system mounted in it, directories
/// made there) stay inside its cgroup and go with it: none is left after
/// the run, and none of sifbox's walks of its cgroups (OOM kills, removal)
/// misses one. On a cgroup v1 host the kernel refuses the mount from the
/// sandbox's user namespace, and that is what the test sees there.
#[test]
fn cgroups_made_inside_a_sandbox_go_with_it() {
    let store = Store::new("sifbox-nested-cg.");
    store
        .import(&harness::debian_tar(), "nested-cg")
        .timeout(Duration::from_secs(300))
        .output()
        .success();
    let name = unique("nestcg");
    let script = "mkdir -p /tmp/cg && \
                  unshare -C sh -c 'mount -t cgroup2 none /tmp/cg 2>/dev/null || \
                  mount -t cgroup -o memory none /tmp/cg' 2>/dev/null || { echo refused; exit 0; }; \
                  mkdir -p /tmp/cg/a/b && echo $$ > /tmp/cg/a/b/cgroup.procs && echo made";
    let out = store
        .cmd([
            "run",
            "--name",
            &name,
            "--allow-userns",
            "--memory",
            "256m",
            "nested-cg",
            "--",
            "sh",
            "-c",
            script,
        ])
        .timeout(Duration::from_secs(60))
        .output();
    out.success();
    let said = out.stdout.trim();
    assert!(said == "refused" || said == "made", "{out:?}");
    // Whatever it made, nothing of the sandbox's is left in any hierarchy.
    let mut left = Vec::new();
    for mount in ["memory", "pids", "cpu,cpuacct", "cpu", "unified", ""] {
        // v1: the user's sandboxes are in sifbox/UID/.
        let base = Path::new("/sys/fs/cgroup").join(mount).join("sifbox");
        let uid = rustix::process::geteuid().as_raw().to_string();
        for base in [base.join(uid), base] {
            if let Ok(rd) = std::fs::read_dir(&base) {
                left.extend(
                    rd.flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with(&name))
                        .map(|e| e.path()),
                );
            }
        }
    }
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

/// A SIF whose tree holds device nodes (mksquashfs pseudo files: a
/// `c 1 7`, as the audit's, and a block device) unpacks without them, as
/// root too: the audit's root unpack made the node live in the store's
/// tree, where a member of a shared store could write through it. Nothing
/// of the image's nodes shows in the sandbox either (its /dev is sifbox's).
#[test]
fn an_images_device_nodes_are_never_made_on_the_host() {
    let store = Store::new("sifbox-devnodes.");
    let dir = tempdir("sifbox-devnodes.");
    let root = dir.path().join("root");
    copy_rootfs(&root);
    std::fs::create_dir_all(root.join("opt")).expect("mkdir opt");
    let part = dir.path().join("root.sqfs");
    harness::run_tool(
        Command::new(harness::require("mksquashfs", "squashfs-tools"))
            .arg(&root)
            .arg(&part)
            .args(["-comp", "gzip", "-noappend", "-quiet"])
            .args(["-p", "opt/full c 666 0 0 1 7"])
            .args(["-p", "opt/disk b 660 0 0 7 0"]),
    );
    let siftool = harness::require("siftool", "siftool");
    let sif = dir.path().join("devnodes.sif");
    harness::run_tool(Command::new(&siftool).arg("new").arg(&sif));
    harness::run_tool(
        Command::new(&siftool)
            .args(["add", "--datatype", "4", "--parttype", "2", "--partfs", "1"])
            .args(["--partarch", "2"])
            .arg(&sif)
            .arg(&part),
    );
    let digest = harness::digest_of(&store.import(&sif, "devnodes").output());
    let out = store
        .cmd([
            "run",
            "devnodes",
            "--",
            "sh",
            "-c",
            "ls /opt; test -e /opt/full && echo full-there; test -e /opt/disk && echo disk-there; true",
        ])
        .output();
    out.success();
    assert!(!out.stdout.contains("there"), "{out:?}");
    // No device node anywhere in the store's tree of the image.
    let tree = store.tree_of(&digest);
    assert!(tree.join("etc").is_dir(), "no tree at {}", tree.display());
    use std::os::unix::fs::FileTypeExt;
    let nodes: Vec<PathBuf> = harness::entries_below(&tree)
        .into_iter()
        .filter(|(_, md)| md.file_type().is_char_device() || md.file_type().is_block_device())
        .map(|(p, _)| p)
        .collect();
    assert!(nodes.is_empty(), "device nodes in the store: {nodes:?}");
    store.empty();
}

/// A sandbox's root (the caller outside) makes files setuid in its
/// `--logs` dir, at /logs and below (the audit's: another local user ran
/// one with the caller's euid): once `run` ends, and once a `start`ed
/// sandbox is stopped, none keeps a setuid or setgid bit. (As host root a
/// file capability set there goes too: `setid` unit tests.)
#[test]
fn setuid_files_left_in_a_logs_dir_lose_their_bits() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sifbox::new();
    let parent = tempdir("sifbox-logs-setid.");
    let plant = "cp /bin/busybox /logs/agent/sh && chmod 4755 /logs/agent/sh && \
                 cp /bin/busybox /logs/top && chmod 6755 /logs/top && \
                 mkdir -p /logs/artifacts/a/b && cp /bin/busybox /logs/artifacts/a/b/g && \
                 chmod 2755 /logs/artifacts/a/b/g && ls -l /logs/agent/sh";
    let setid_files = |logs: &Path| -> Vec<String> {
        harness::entries_below(logs)
            .into_iter()
            .filter(|(_, md)| !md.is_dir() && md.permissions().mode() & 0o6000 != 0)
            .map(|(p, md)| format!("{} {:o}", p.display(), md.permissions().mode()))
            .collect()
    };
    let logs = parent.path().join("run");
    let out = sb
        .run(["--logs", logs.to_str().expect("utf-8"), "sh", "-c", plant])
        .output();
    out.success();
    assert!(
        out.stdout.contains("rws"),
        "the bit was not set inside: {out:?}"
    );
    assert_eq!(setid_files(&logs), Vec::<String>::new(), "after run");
    let logs = parent.path().join("start");
    let sandbox = Started::new(
        &sb,
        &unique("logs-setid"),
        &["--logs", logs.to_str().expect("utf-8")],
        &[],
    );
    sandbox.exec(&[], &["sh", "-c", plant]).success();
    // While it runs, no other local user reaches them (the dir and its
    // subdirs are the caller's alone); root can be someone else.
    if harness::is_root() {
        use std::os::unix::process::CommandExt;
        for p in [logs.join("top"), logs.join("agent/sh")] {
            assert!(p.is_file(), "{} was not planted", p.display());
            let reached = std::process::Command::new("sh")
                .args(["-c", "test -e \"$1\"", "sh"])
                .arg(&p)
                .uid(65534)
                .gid(65534)
                .status()
                .expect("sh as nobody");
            assert!(!reached.success(), "nobody reaches {}", p.display());
        }
    }
    sandbox.stop();
    assert_eq!(setid_files(&logs), Vec::<String>::new(), "after stop");
}

/// A tree 300 levels deep in a `--logs` dir, made by a user of the image
/// (below names that make its path far longer than PATH_MAX), with a
/// setuid file at the bottom: once `run` ends the file has lost its bit,
/// and (unprivileged, where that user is another id of the caller's) every
/// level is the caller's. On main give-back stopped at 256 levels and the
/// strip at PATH_MAX, leaving the file setuid.
#[test]
fn a_300_level_tree_in_a_logs_dir_is_given_back_and_stripped() {
    use rustix::fs::{Mode, OFlags};
    let sb = Sifbox::new();
    let parent = tempdir("sifbox-logs-deep.");
    let logs = parent.path().join("logs");
    let name = "d".repeat(40);
    let plant = format!(
        "cd /logs/agent && i=0 && while [ $i -lt 300 ]; do mkdir {name} && cd -P {name} || exit 1; \
         i=$((i+1)); done; cp /bin/busybox sh && chmod 4755 sh && ls -l sh"
    );
    let out = sb
        .run([
            "--logs",
            logs.to_str().expect("utf-8"),
            "--user",
            "user",
            "sh",
            "-c",
            &plant,
        ])
        .output();
    out.success();
    assert!(
        out.stdout.contains("rws"),
        "the bit was not set inside: {out:?}"
    );
    let mine = harness::my_ids();
    let mut fd = rustix::fs::open(
        logs.join("agent"),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .expect("open agent/");
    for level in 1..=300 {
        fd = rustix::fs::openat(
            &fd,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .unwrap_or_else(|e| panic!("level {level}: {e}"));
        if !harness::is_root() {
            let st = rustix::fs::fstat(&fd).expect("stat");
            assert_eq!(
                (st.st_uid, st.st_gid),
                mine,
                "level {level} is not the caller's"
            );
        }
    }
    let st = rustix::fs::statat(&fd, "sh", rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .expect("stat the file");
    assert_eq!(
        st.st_mode & 0o6000,
        0,
        "setuid at depth 300: {:o}",
        st.st_mode
    );
    if !harness::is_root() {
        assert_eq!((st.st_uid, st.st_gid), mine, "the file is not the caller's");
    }
}

// ===========================================================================
// 7. The caller's runtime dir, store and stdio (another local user)
// ===========================================================================

/// Runs `script` (sh) with sifbox's default runtime dir, in a mount
/// namespace of its own whose /dev/shm is a fresh tmpfs (mode 1777, as the
/// host's), after `squat` ("" or "squat NAME"; "link NAME TARGET") staged
/// what another user would have left there: as root a dir of uid 1001
/// (sbtest), mode 0777; unprivileged (in a user namespace of its own, the
/// test's uid mapped to itself) a dir of another user (host root's
/// /usr/share, bound there, seen as `nobody`). The script sees `$ME` (its
/// uid), `$SIFBOX`, `$ROOTFS` and `$OPTS` (`--userns single` unprivileged:
/// newuidmap does not map from a nested user namespace). Nothing of the
/// host's /dev/shm is touched.
fn in_private_shm(sb: &Sifbox, squats: &[&str], script: &str) -> Output {
    harness::require("unshare", "util-linux");
    harness::require("python3", "python3");
    let (uid, _) = harness::my_ids();
    let stage = format!(
        r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(r, what):
    if r != 0:
        sys.exit(f"{{what}}: {{os.strerror(ctypes.get_errno())}}")
check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"mode=1777"), "mounting /dev/shm")
for squat in {squats:?}:
    words = squat.split()
    path = "/dev/shm/" + words[1]
    if words[0] == "link":
        os.symlink(words[2], path)
    elif os.geteuid() == 0:
        os.mkdir(path)
        os.chown(path, 1001, 1001)
        os.chmod(path, 0o777)
    else:
        os.mkdir(path)
        check(libc.mount(b"/usr/share", path.encode(), None, 4096, None), "binding /usr/share")
if os.geteuid() != 0:
    # The staging's capabilities end here (PR_CAP_AMBIENT_CLEAR_ALL): sifbox
    # runs as the plain user it is.
    check(libc.prctl(47, 4, 0, 0, 0), "clearing ambient capabilities")
os.environ.pop("SIFBOX_RUNTIME", None)
os.environ.pop("XDG_RUNTIME_DIR", None)
os.environ["ME"] = "{uid}"
os.environ["SIFBOX"] = {sifbox:?}
os.environ["ROOTFS"] = {rootfs:?}
os.environ["OPTS"] = "" if os.geteuid() == 0 else "--userns single"
os.execv("/bin/sh", ["sh", "-c", {script:?}])
"#,
        sifbox = sifbox_bin().display().to_string(),
        rootfs = rootfs().display().to_string(),
    );
    let mut args = vec!["-m", "--propagation", "private"];
    if !harness::is_root() {
        args.extend(["-c", "--keep-caps"]);
    }
    args.extend(["python3", "-c", &stage]);
    sb.program("unshare", args).output()
}

/// Another user made `/dev/shm/sifbox-UID` first (the audit's: every
/// command of the victim then failed, exit 125): it is passed over, with a
/// warning naming its owner, for `sifbox-UID.1`, private (0700) and the
/// caller's, which later commands find again (a sandbox started by one is
/// stopped by another); nothing lands in the squatter's dir.
#[test]
fn a_runtime_dir_squatted_in_dev_shm_is_passed_over_for_a_private_one() {
    let sb = Sifbox::new();
    let (uid, _) = harness::my_ids();
    let name = unique("squat");
    let out = in_private_shm(
        &sb,
        &[&format!("squat sifbox-{uid}")],
        &format!(
            r#"$SIFBOX run $OPTS --rootfs $ROOTFS -- true || exit 10
$SIFBOX start $OPTS --rootfs $ROOTFS --name {name} >/dev/null || exit 11
$SIFBOX ps | grep -q {name} || exit 12
$SIFBOX exec {name} echo in-{name} || exit 13
$SIFBOX stop {name} >/dev/null || exit 14
echo "fallback: $(stat -c '%u %a' /dev/shm/sifbox-$ME.1)"
echo "squatted: $(ls -A /dev/shm/sifbox-$ME | grep -c sandboxes)"
"#
        ),
    );
    out.success();
    assert!(out.stdout.contains(&format!("in-{name}")), "{out:?}");
    assert!(
        out.stdout.contains(&format!("fallback: {uid} 700")),
        "the fallback is not private: {out:?}"
    );
    if harness::is_root() {
        assert!(
            out.stdout.contains("squatted: 0"),
            "something landed in the squatter's dir: {out:?}"
        );
    }
    assert!(
        out.stderr
            .contains(&format!("/dev/shm/sifbox-{uid} belongs to uid")),
        "no warning naming the squatter: {}",
        out.stderr
    );
}

/// The audit's race: another user flips `/dev/shm/sifbox-UID` between a
/// symlink to a private dir of the victim's (which passes a check by path)
/// and one to their own dir; 3 to 5 of 30 control sockets landed in
/// theirs. The default dir is opened once without following a symlink and
/// reached through its descriptor: every sandbox is in the caller's own
/// fallback dir and none in the attacker's.
#[test]
fn a_symlink_raced_into_dev_shm_never_receives_a_control_socket() {
    let sb = Sifbox::new();
    let prefix = unique("race");
    let out = in_private_shm(
        &sb,
        &[],
        &format!(
            r#"mkdir -m 0700 /dev/shm/victim-private
mkdir -m 0777 /dev/shm/attacker /dev/shm/attacker/sandboxes
( while :; do ln -sfn /dev/shm/victim-private /dev/shm/sifbox-$ME; ln -sfn /dev/shm/attacker /dev/shm/sifbox-$ME; done ) &
flipper=$!
started=0
for i in $(seq 1 30); do
  $SIFBOX start $OPTS --rootfs $ROOTFS --name {prefix}-$i >/dev/null 2>&1 && started=$((started+1))
done
landed=$(ls /dev/shm/attacker/sandboxes /dev/shm/victim-private/sandboxes 2>/dev/null | grep -c {prefix})
kill $flipper; wait $flipper 2>/dev/null
echo "started=$started landed=$landed"
for i in $(seq 1 30); do $SIFBOX stop --timeout 0 {prefix}-$i >/dev/null 2>&1; done
ls /dev/shm/sifbox-$ME.1/sandboxes | grep -c {prefix} || true
"#
        ),
    );
    out.success();
    assert!(
        out.stdout.contains("started=30 landed=0"),
        "sandboxes were refused or reached through the attacker's link: {out:?}"
    );
    assert!(
        out.stdout.trim_end().ends_with("\n0"),
        "sandboxes left in the fallback dir after stop: {out:?}"
    );
}

/// `SIFBOX_CACHE` under a directory any user can write (not sticky):
/// another user could rename the store away and put theirs in its place
/// (its trees are what sandboxes run). Refused (exit 125) naming that
/// directory and the fix; nothing is made.
#[test]
fn a_store_whose_path_another_user_could_swap_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sifbox::new();
    let parent = tempdir("sifbox-open-store.");
    let open = parent.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let store = open.join("store");
    let out = sb.cmd(["image", "ls"]).env("SIFBOX_CACHE", &store).output();
    out.code_is(125);
    assert!(
        out.stderr.contains(&open.display().to_string()) && out.stderr.contains("could swap"),
        "{out:?}"
    );
    assert!(out.stderr.contains("SIFBOX_CACHE"), "no fix given: {out:?}");
    assert!(!store.exists(), "the store was made");
    // Sticky, as /tmp: only an entry's owner may rename it.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    sb.cmd(["image", "ls"])
        .env("SIFBOX_CACHE", &store)
        .output()
        .success();
}

/// The caller's log file given as stdout (`>> LOG`), of `run` and of
/// `exec`: the command's /proc/self/fd/1 is a pipe sifbox relays from,
/// not the file, which it could otherwise reopen and read (the audit's:
/// what the caller logged before) or rewrite.
#[test]
fn a_callers_log_file_given_as_stdout_is_out_of_reach() {
    let sb = Sifbox::new();
    let decoy = Decoy::new();
    let log = decoy.path().join("caller.log");
    std::fs::write(&log, format!("{}\n", decoy.secret)).expect("log");
    let peek = "readlink /proc/self/fd/1; readlink /proc/self/fd/2; \
                case $(readlink /proc/self/fd/1) in pipe:*) ;; *) cat /proc/self/fd/1 ;; esac; \
                echo written-$$";
    host_sh(
        &sb,
        &format!(
            "{} run --rootfs {} -- sh -c {} >>{log} 2>&1",
            bin(),
            root_arg(),
            shell_quote(peek),
            log = shell_quote(&log.display().to_string())
        ),
    )
    .success();
    let sandbox = Started::plain(&sb, "log");
    host_sh_starting(
        &sb,
        &format!(
            "{} exec {} sh -c {} >>{log} 2>>{log}",
            bin(),
            sandbox.name,
            shell_quote(peek),
            log = shell_quote(&log.display().to_string())
        ),
    )
    .success();
    sandbox.stop();
    let text = std::fs::read_to_string(&log).expect("log");
    assert_eq!(
        text.matches(&decoy.secret).count(),
        1,
        "the command read the caller's log: {text}"
    );
    assert_eq!(text.matches("pipe:").count(), 4, "not pipes: {text}");
    assert_eq!(text.matches("written-").count(), 2, "output lost: {text}");
}

/// The audit's: a process an `exec` left running kept the caller's
/// terminal and read what was typed there afterwards. Here the terminal is
/// a pty this test holds: the command reads its first line (relayed), a
/// process it leaves waits, and what is typed once the exec returned never
/// reaches it (it gets end-of-file: sifbox, the writer of its pipe, is gone).
#[test]
fn a_process_an_exec_leaves_gets_nothing_typed_on_the_callers_terminal() {
    use std::io::Write;
    use std::os::fd::OwnedFd;
    use std::process::Stdio;
    let sb = Sifbox::new();
    let sandbox = Started::plain(&sb, "tty");
    let master =
        rustix::pty::openpt(rustix::pty::OpenptFlags::RDWR | rustix::pty::OpenptFlags::NOCTTY)
            .expect("openpt");
    rustix::pty::grantpt(&master).expect("grantpt");
    rustix::pty::unlockpt(&master).expect("unlockpt");
    let slave_name = rustix::pty::ptsname(&master, Vec::new()).expect("ptsname");
    let slave: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(slave_name.to_str().expect("utf-8"))
        .expect("opening the pty")
        .into();
    let mut typing = std::fs::File::from(master);
    let secret = unique("typed-later");
    typing.write_all(b"first-line\n").expect("typing");
    let out = Command::new(sifbox_bin())
        .env("SIFBOX_RUNTIME", sb.runtime())
        .args(["exec", "-i", &sandbox.name, "sh", "-c"])
        .arg(
            // fd 3: an asynchronous list's stdin is /dev/null in sh.
            "read l; echo got:$l; exec 3<&0; \
             ( sleep 1; read left <&3; echo \"left:$left\" > /tmp/left-read ) >/dev/null 2>&1 &",
        )
        .stdin(Stdio::from(slave))
        .output()
        .expect("running exec");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("got:first-line"),
        "{out:?}"
    );
    typing
        .write_all(format!("{secret}\n").as_bytes())
        .expect("typing");
    let deadline = Instant::now() + Duration::from_secs(20);
    let read = loop {
        let o = sandbox.exec(&[], &["sh", "-c", "cat /tmp/left-read 2>/dev/null"]);
        if o.stdout.contains("left:") || Instant::now() > deadline {
            break o.stdout;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    sandbox.stop();
    assert!(
        read.contains("left:"),
        "the left process never read: {read:?}"
    );
    assert!(
        !read.contains(&secret),
        "a process the exec left read the caller's terminal: {read}"
    );
}
