//! Integration tests of the tokio API (`sifbox_engine::aio`) against the real
//! supervisor.
//!
//! They need the sifbox binary (`$SIFBOX_BIN`, else the one cargo built beside them:
//! run `cargo build -p sifbox` first) and the busybox test rootfs
//! (`$SIFBOX_TEST_ROOTFS`, else `target/test-rootfs`, made by
//! `scripts/make-test-rootfs.sh`). Unless `$SIFBOX_RUNTIME` is set, this test
//! process uses its own runtime root (`/dev/shm/sifbox-aio-tests-UID`), set
//! once before any sandbox starts; every test uses unique sandbox names, so
//! tests run in parallel.

use std::collections::HashSet;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use sifbox_engine::aio::{self, AsyncSandbox, SpawnStdio, Stdio};
use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::{ExecStatus, StartOptions};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The sifbox binary that serves as supervisor.
fn sifbox_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SIFBOX_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    // This test runs from <profile dir>/deps/; cargo puts sifbox in the
    // profile dir, wherever the target dir and triple put that.
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("sifbox"))
        .unwrap_or_default();
    assert!(
        bin.is_file(),
        "the sifbox binary {} is missing: build it first with `cargo build -p sifbox` (or set SIFBOX_BIN)",
        bin.display()
    );
    bin
}

/// The busybox test root file system.
fn rootfs() -> PathBuf {
    let root = std::env::var_os("SIFBOX_TEST_ROOTFS")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target").join("test-rootfs"));
    assert!(
        root.join("etc/sifbox-test-rootfs").is_file(),
        "the test rootfs {} is missing: build it with scripts/make-test-rootfs.sh (or set SIFBOX_TEST_ROOTFS)",
        root.display()
    );
    root
}

static RUNTIME: Once = Once::new();

/// Points this test process at its own runtime root, once, before any
/// sandbox starts (the engine has no way to pass one explicitly).
fn setup() {
    RUNTIME.call_once(|| {
        if std::env::var_os("SIFBOX_RUNTIME").is_some_and(|v| !v.is_empty()) {
            return;
        }
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "sifbox-aio-tests-{}",
            rustix::process::geteuid().as_raw()
        ));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .expect("runtime root");
        std::env::set_var("SIFBOX_RUNTIME", &dir);
    });
}

/// A sandbox name no other test (or test process) uses.
fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "aio-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn start(tag: &str) -> AsyncSandbox {
    setup();
    let spec = aio::default_spec(&unique(tag), rootfs()).expect("spec");
    AsyncSandbox::start(spec, StartOptions::new(sifbox_bin()))
        .await
        .expect("start")
}

fn req(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin:/usr/sbin:/sbin".into())],
        cwd: "/".into(),
        ..Default::default()
    }
}

/// The sandbox's PID 1 (the only child of its outer supervisor).
fn sandbox_init(sb: &AsyncSandbox) -> i32 {
    let sup = sb.supervisor_pid().expect("supervisor pid");
    let children = std::fs::read_to_string(format!("/proc/{sup}/task/{sup}/children"))
        .expect("supervisor's children");
    children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the sandbox's init")
}

/// Host pid and argv of every process in the sandbox's pid namespace.
fn sandbox_procs(sb: &AsyncSandbox) -> Vec<(i32, Vec<String>)> {
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", sandbox_init(sb))).expect("pid ns");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/ns/pid"))
            .ok()
            .as_ref()
            != Some(&ns)
        {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let argv = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        out.push((pid, argv));
    }
    out
}

/// The sleeps left in the sandbox.
fn sleeps(sb: &AsyncSandbox) -> Vec<(i32, Vec<String>)> {
    sandbox_procs(sb)
        .into_iter()
        .filter(|(_, argv)| argv.first().is_some_and(|a| a.ends_with("sleep")))
        .collect()
}

/// Polls `cond` for up to 5 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The walk-through of the issue: start, exec (stdout, exit code, timeout),
/// a line protocol over a spawned process, kill, copies both ways, stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle() {
    let sb = start("life").await;
    let name = sb.name().to_string();
    assert!(aio::list()
        .await
        .expect("list")
        .iter()
        .any(|s| s.name == name && s.running));

    // exec: stdout, stderr, exit code.
    let out = sb
        .exec(req(&["sh", "-c", "echo hello; echo oops >&2; exit 3"]))
        .await
        .expect("exec");
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str(), out.exit_code),
        ("hello\n", "oops\n", 3),
        "{out:?}"
    );
    assert!(!out.timed_out && !out.truncated && out.error.is_none());

    // A timeout kills the command: 124.
    let t = Instant::now();
    let out = sb
        .exec(ExecRequest {
            timeout_ms: Some(300),
            ..req(&["sh", "-c", "echo partial; sleep 1000"])
        })
        .await
        .expect("exec with timeout");
    assert_eq!(out.exit_code, 124, "{out:?}");
    assert!(out.timed_out);
    assert_eq!(out.stdout, "partial\n", "partial output is kept");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(sleeps(&sb).is_empty(), "left: {:?}", sleeps(&sb));

    // A line protocol over a spawned `cat`: 100 round trips.
    let mut cat = sb.spawn(req(&["cat"])).await.expect("spawn cat");
    assert!(cat.pid().is_some());
    for i in 0..100 {
        let msg = format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"echo"}}"#);
        cat.writeline(&msg).await.expect("writeline");
        let back = cat.readline().await.expect("readline");
        assert_eq!(back.as_deref(), Some(msg.as_str()));
    }
    cat.close_stdin();
    assert_eq!(cat.readline().await.expect("eof"), None);
    assert_eq!(
        cat.wait().await.expect("wait"),
        ExecStatus::Exited {
            code: 0,
            timed_out: false
        }
    );

    // kill() ends the command and what it started, setsid included.
    let mut p = sb
        .spawn(req(&["sh", "-c", "setsid sleep 1000 & sleep 1000"]))
        .await
        .expect("spawn sleeps");
    eventually("both sleeps run", || sleeps(&sb).len() == 2).await;
    p.kill().await.expect("kill");
    assert!(sleeps(&sb).is_empty(), "left: {:?}", sleeps(&sb));
    let st = p.wait().await.expect("wait");
    assert_eq!(st.code(), 137, "{st:?}");
    // Killing again is fine.
    p.kill().await.expect("kill again");

    // Copies both ways: a small tree with a symlink, and a single file.
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    std::fs::write(src.join("a.txt"), "alpha").expect("write");
    std::fs::write(src.join("sub/b.txt"), "beta").expect("write");
    std::os::unix::fs::symlink("a.txt", src.join("link")).expect("symlink");
    sb.upload(&src, "/tmp/up", None).await.expect("upload dir");
    sb.upload(src.join("a.txt"), "/tmp/single.txt", None)
        .await
        .expect("upload file");
    let out = sb
        .exec(req(&[
            "sh",
            "-c",
            "cat /tmp/up/a.txt /tmp/up/sub/b.txt /tmp/single.txt; echo; readlink /tmp/up/link",
        ]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, "alphabetaalpha\na.txt\n", "{out:?}");
    let back = tmp.path().join("back");
    sb.download("/tmp/up", &back).await.expect("download dir");
    assert_eq!(
        std::fs::read_to_string(back.join("a.txt")).expect("a"),
        "alpha"
    );
    assert_eq!(
        std::fs::read_to_string(back.join("sub/b.txt")).expect("b"),
        "beta"
    );
    assert_eq!(
        std::fs::read_link(back.join("link")).expect("link"),
        PathBuf::from("a.txt")
    );
    sb.download("/tmp/single.txt", tmp.path().join("one.txt"))
        .await
        .expect("download file");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("one.txt")).expect("one"),
        "alpha"
    );

    // stop: gone from list(), runtime dir and all.
    let dir = sb.dir().to_path_buf();
    let sup = sb.supervisor_pid().expect("pid");
    sb.stop(Duration::from_secs(2)).await.expect("stop");
    assert!(!aio::list()
        .await
        .expect("list")
        .iter()
        .any(|s| s.name == name));
    assert!(!dir.exists());
    assert!(!Path::new(&format!("/proc/{sup}")).exists());
    // Stopping again succeeds; using it is a clear error.
    sb.stop(Duration::ZERO).await.expect("stop again");
    let err = sb.exec(req(&["true"])).await.expect_err("exec after stop");
    assert!(err.to_string().contains("not running"), "{err}");
}

/// Commands that cannot run report 125, 126 and 127, as `sifbox run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_of_failed_starts() {
    let sb = start("codes").await;
    let out = sb.exec(req(&["no-such-command"])).await.expect("exec");
    assert_eq!(out.exit_code, 127, "{out:?}");
    assert!(out.error.is_some());
    let out = sb
        .exec(req(&["/usr/bin/not-executable-test"]))
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 126, "{out:?}");
    let out = sb
        .exec(ExecRequest {
            cwd: "/no/such/dir".into(),
            ..req(&["true"])
        })
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 125, "{out:?}");
    // A spawn that cannot start is a process whose wait says why.
    let mut p = sb.spawn(req(&["no-such-command"])).await.expect("spawn");
    assert!(p.pid().is_none());
    assert!(matches!(
        p.wait().await.expect("wait"),
        ExecStatus::Failed { code: 127, .. }
    ));
    sb.stop(Duration::ZERO).await.expect("stop");
}

/// The Command builder: base environment, env overrides, cwd, user,
/// stdin, and env values that never show up in an argv.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_builder_and_env_secrecy() {
    let sb = start("cmd").await;
    sb.set_base_env(vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("HOME".into(), "/root".into()),
        ("FROM_BASE".into(), "base".into()),
    ])
    .await
    .expect("base env");
    let secret = format!("s3cret-{}", std::process::id());
    let out = sb
        .command("sh")
        .args(["-c", "echo $FROM_BASE $SECRET $HOME; pwd; id -u; cat"])
        .env("SECRET", &secret)
        .cwd("/tmp")
        .user("1000")
        .stdin_bytes("from stdin\n")
        .output()
        .await
        .expect("output");
    assert_eq!(
        out.stdout,
        format!("base {secret} /home/user\n/tmp\n1000\nfrom stdin\n"),
        "{out:?}"
    );

    // While a process holding the secret runs, no argv on the host has it.
    let mut p = sb
        .command("sh")
        .args(["-c", "read x"])
        .env("SECRET", &secret)
        .spawn()
        .await
        .expect("spawn");
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(&secret),
                "the secret is in the argv of {:?}",
                e.path()
            );
        }
    }
    p.writeline("done").await.expect("writeline");
    assert_eq!(p.wait().await.expect("wait").code(), 0);

    // Output limits keep the tail.
    let out = sb
        .command("sh")
        .args(["-c", "seq 1 1000"])
        .max_output(9)
        .output()
        .await
        .expect("output");
    assert!(out.truncated);
    assert_eq!(out.stdout, "999\n1000\n");
    sb.stop(Duration::ZERO).await.expect("stop");
}

/// A command takes what the image says execs default to (its WORKDIR, its
/// USER, its Apptainer env scripts), as `sifbox exec` does, unless it says
/// otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_take_the_images_exec_defaults() {
    let sb = start("defaults").await;
    // The env script the image would carry, written into the sandbox.
    let out = sb
        .exec(req(&[
            "sh",
            "-c",
            "mkdir -p /.singularity.d/env && echo 'export FROM_SCRIPT=yes' > /.singularity.d/env/90-x.sh",
        ]))
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0, "{out:?}");
    sifbox_engine::Sandbox::attach(sb.name())
        .expect("attach")
        .set_exec_defaults(&sifbox_engine::ExecDefaults {
            cwd: Some("/tmp".into()),
            user: Some("1000".into()),
            source_env_scripts: true,
        })
        .expect("defaults");
    let script = "echo ${FROM_SCRIPT:-no}; pwd; id -u";
    let out = sb
        .command("sh")
        .args(["-c", script])
        .output()
        .await
        .expect("output");
    assert_eq!(out.stdout, "yes\n/tmp\n1000\n", "{out:?}");
    let out = sb
        .command("sh")
        .args(["-c", script])
        .cwd("/")
        .user("0")
        .output()
        .await
        .expect("output");
    assert_eq!(out.stdout, "yes\n/\n0\n", "{out:?}");
    sb.stop(Duration::ZERO).await.expect("stop");
}

/// 20 execs at once in one sandbox, from clones of one handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_execs() {
    let sb = start("conc").await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let sb = sb.clone();
        set.spawn(async move {
            let out = sb
                .exec(req(&["sh", "-c", &format!("sleep 0.2; echo {i}")]))
                .await
                .expect("exec");
            assert_eq!(out.stdout, format!("{i}\n"));
            assert_eq!(out.exit_code, 0);
        });
    }
    let t = Instant::now();
    while let Some(r) = set.join_next().await {
        r.expect("task");
    }
    // Run one after the other they would take 4 s.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    sb.stop(Duration::ZERO).await.expect("stop");
}

/// Giving up on a command (dropping its future or its Process) kills it and
/// everything it started; exec returns when the command ends even if a
/// background process keeps its output open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_kills_and_background_does_not_hang() {
    let sb = start("cancel").await;
    let r = tokio::time::timeout(
        Duration::from_millis(300),
        sb.exec(req(&["sh", "-c", "setsid sleep 1000 & sleep 1000"])),
    )
    .await;
    assert!(r.is_err(), "the exec should still run: {r:?}");
    eventually("a dropped exec leaves nothing", || sleeps(&sb).is_empty()).await;

    let p = sb
        .spawn(req(&["sh", "-c", "setsid sleep 1000 & sleep 1000"]))
        .await
        .expect("spawn");
    eventually("both sleeps run", || sleeps(&sb).len() == 2).await;
    drop(p);
    eventually("a dropped process leaves nothing", || {
        sleeps(&sb).is_empty()
    })
    .await;

    // A daemon that keeps stdout open does not hold up exec.
    let t = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        sb.exec(req(&["sh", "-c", "sleep 1000 & echo started"])),
    )
    .await
    .expect("exec returns while its background child runs")
    .expect("exec");
    assert_eq!(out.stdout, "started\n");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    eventually("the background sleep runs on", || sleeps(&sb).len() == 1).await;

    // readline under a timeout loses nothing.
    let mut p = sb
        .spawn(req(&["sh", "-c", "printf ab; sleep 0.5; echo cd"]))
        .await
        .expect("spawn");
    let early = tokio::time::timeout(Duration::from_millis(150), p.readline()).await;
    assert!(early.is_err(), "{early:?}");
    assert_eq!(p.readline().await.expect("line").as_deref(), Some("abcd"));
    assert_eq!(p.readline().await.expect("eof"), None);
    assert_eq!(p.wait().await.expect("wait").code(), 0);

    // SIGTERM through signal(): the command's process group.
    let mut p = sb
        .spawn_with(
            req(&["sleep", "1000"]),
            SpawnStdio {
                stdin: Stdio::Null,
                stdout: Stdio::Null,
                stderr: Stdio::Null,
            },
        )
        .await
        .expect("spawn");
    p.signal(15).await.expect("signal");
    assert_eq!(p.wait().await.expect("wait").code(), 143);

    sb.stop(Duration::ZERO).await.expect("stop");
}

/// attach() finds a sandbox by name; gc() removes one whose supervisor died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_and_gc() {
    let sb = start("gc").await;
    let name = sb.name().to_string();
    let other = AsyncSandbox::attach(&name).await.expect("attach");
    assert_eq!(other.supervisor_pid(), sb.supervisor_pid());
    let out = other.exec(req(&["hostname"])).await.expect("exec");
    assert_eq!(out.stdout.trim(), name);
    drop(other);
    sb.ping()
        .await
        .expect("still running after the attached handle went");

    let init = sandbox_init(&sb);
    let sup = sb.supervisor_pid().expect("pid");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(sup).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill supervisor");
    eventually("the sandbox dies with its supervisor", || {
        !Path::new(&format!("/proc/{init}")).exists()
            || std::fs::read_to_string(format!("/proc/{init}/stat"))
                .is_ok_and(|s| s.contains(") Z"))
    })
    .await;
    let dead = aio::list()
        .await
        .expect("list")
        .into_iter()
        .find(|s| s.name == name);
    assert!(dead.as_ref().is_none_or(|s| !s.running), "{dead:?}");
    let removed: HashSet<String> = aio::gc().await.expect("gc").into_iter().collect();
    // A sandbox that another test starts meanwhile reaps dead ones too.
    assert!(removed.contains(&name) || !sb.dir().exists(), "{removed:?}");
    assert!(!sb.dir().exists());
    assert!(!aio::list()
        .await
        .expect("list")
        .iter()
        .any(|s| s.name == name));
    // Its handle now says so, and dropping it reaps the supervisor.
    let err = sb.exec(req(&["true"])).await.expect_err("dead sandbox");
    assert!(err.to_string().contains("not running"), "{err}");
    sb.stop(Duration::ZERO).await.expect("stop a dead sandbox");
}

/// A hostile command started through the async API (the path the Python
/// harnesses take) reaches nothing of sifbox's: the probe's supervisor
/// attacks (init's and the worker's fds, memory, environment, pidfd_getfd,
/// ptrace) are all contained, as root of the sandbox and as a user of the
/// image, in a sandbox whose exec defaults the API now reads. (The server
/// side is the one `sifbox exec` uses; `e2e hostile::*` runs the same
/// attacks through the CLI as root and as the unprivileged user.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_commands_through_the_api_reach_nothing_of_sifbox() {
    let sb = start("hostile").await;
    sifbox_engine::Sandbox::attach(sb.name())
        .expect("attach")
        .set_exec_defaults(&sifbox_engine::ExecDefaults {
            cwd: Some("/tmp".into()),
            ..sifbox_engine::ExecDefaults::default()
        })
        .expect("defaults");
    let secret = format!("api-key-{}", std::process::id());
    for user in [None, Some("1000")] {
        let mut cmd = sb.command("/usr/bin/sifbox-probe");
        cmd.args([
            "attack",
            "supervisor-fds",
            "supervisor-mem",
            "supervisor-environ",
            "supervisor-pidfd-getfd",
            "supervisor-ptrace",
        ])
        .env("API_KEY", &secret);
        if let Some(u) = user {
            cmd.user(u);
        }
        let out = cmd.output().await.expect("probe");
        assert_eq!(out.exit_code, 0, "{out:?}");
        let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("a JSON report");
        let attacks = report["attacks"].as_object().expect("attacks");
        assert_eq!(attacks.len(), 5, "{report}");
        for (name, a) in attacks {
            assert_eq!(a["contained"], true, "{name} got through as {user:?}: {a}");
        }
    }
    sb.stop(Duration::ZERO).await.expect("stop");
}
