//! End-to-end tests of `sifbox eval` (issue 7): the example suite with its
//! expected rewards; agents, time limits, networks, users, env and
//! healthchecks; a broken Dockerfile; Ctrl-C in the middle of a job, which
//! must leave no sandbox, process or mount, and `--resume`; bad input.
//!
//! Most cases run tasks on `evalbase`: the busybox test rootfs plus the
//! host's bash (tasks are run with bash), imported into each test's own
//! store. The example suite needs the Debian bookworm minbase tarball
//! (`$SIFBOX_TEST_DEBIAN_TAR`, default `target/bookworm-minbase.tar`, made
//! by scripts/bootstrap-base.sh) and, for its compile-c task's build, the
//! network to Debian's mirror.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{
    self, copy_rootfs, debian_tar, eventually, mode_of, processes_with_arg, read_json, run_tool,
    unique, unique_number, Store, Tree,
};
use serde_json::Value;

/// How long an eval of the small cases may take.
const EVAL_TIMEOUT: Duration = Duration::from_secs(120);

/// A test's store and a dir for its tasks and the job's output.
pub(crate) struct Env {
    store: Store,
    dir: Tree,
}

impl Env {
    fn new() -> Env {
        Env {
            store: Store::new("sifbox-eval-cache."),
            dir: Tree::temp("sifbox-eval."),
        }
    }

    /// A fresh store with `evalbase` in it.
    pub(crate) fn with_evalbase() -> Env {
        let env = Env::new();
        let base = env.path("evalbase");
        make_evalbase(&base);
        env.import(&base, "evalbase");
        env
    }

    /// Imports the tree `root` into the store as `name`.
    fn import(&self, root: &Path, name: &str) {
        self.store
            .import(root, name)
            .timeout(EVAL_TIMEOUT)
            .output()
            .success();
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub(crate) fn out(&self) -> PathBuf {
        self.path("out")
    }

    /// Writes a file (parents made; `.sh` files executable).
    fn write(&self, rel: &str, text: &str) {
        self.dir.file(rel, text);
        if rel.ends_with(".sh") {
            self.dir.mode(rel, 0o755);
        }
    }

    /// A task `tasks/NAME` on `evalbase` (unless `toml` names another
    /// environment), with this solution and test.
    pub(crate) fn task(&self, name: &str, toml: &str, solve: &str, test: &str) -> PathBuf {
        let toml = if toml.contains("docker_image") || toml.contains("#dockerfile") {
            toml.to_string()
        } else if toml.contains("[environment]") {
            toml.replace(
                "[environment]",
                "[environment]\ndocker_image = \"evalbase\"",
            )
        } else {
            format!("[environment]\ndocker_image = \"evalbase\"\n{toml}")
        };
        self.write(&format!("tasks/{name}/task.toml"), &toml);
        self.write(
            &format!("tasks/{name}/instruction.md"),
            &format!("The instruction of {name}.\n"),
        );
        self.write(&format!("tasks/{name}/solution/solve.sh"), solve);
        self.write(&format!("tasks/{name}/tests/test.sh"), test);
        self.path(&format!("tasks/{name}"))
    }

    /// A task `tasks/good` that would pass: what a malformed task beside
    /// it must not let run.
    fn good_task(&self) -> PathBuf {
        self.task(
            "good",
            "",
            "#!/bin/sh\ntrue\n",
            "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
        )
    }

    /// `sifbox eval --out OUT tasks/`: the whole `tasks/` dir as one job.
    fn eval_all(&self) -> harness::Output {
        let tasks = self.path("tasks").display().to_string();
        let out_dir = self.out().display().to_string();
        self.cmd(&["eval", "--out", &out_dir, &tasks]).output()
    }

    fn cmd(&self, args: &[&str]) -> harness::Invocation<'_> {
        self.store.cmd(args).timeout(EVAL_TIMEOUT)
    }

    /// `sifbox eval --out OUT --progress plain ARGS...`
    pub(crate) fn eval(&self, args: &[&str]) -> harness::Invocation<'_> {
        let out = self.out().display().to_string();
        let mut all = vec!["eval", "--out", &out, "--progress", "plain"];
        all.extend_from_slice(args);
        self.cmd(&all)
    }

    fn json(&self, rel: &str) -> Value {
        read_json(&self.out().join(rel))
    }

    pub(crate) fn result(&self, job: &str, rollout: &str) -> Value {
        self.json(&format!("{job}/{rollout}/result.json"))
    }
}

/// The test rootfs plus the host's bash and the libraries it needs.
fn make_evalbase(dst: &Path) {
    copy_rootfs(dst);
    let bash = Path::new("/bin/bash");
    let ldd = run_tool(Command::new("ldd").arg(bash));
    let mut files = vec![bash.to_path_buf()];
    for line in ldd.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)".
        let path = line
            .split("=>")
            .last()
            .and_then(|s| s.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        files.extend(path.map(PathBuf::from));
    }
    for f in files {
        let to = dst.join(f.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&f, &to).unwrap_or_else(|e| panic!("copying {}: {e}", f.display()));
    }
}

fn example_tasks() -> PathBuf {
    match std::env::var_os("SIFBOX_TEST_TASKS").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tasks"),
    }
}

/// (status, error_class, reward) of a result.
fn outcome(r: &Value) -> (String, Option<String>, Option<f64>) {
    (
        r["status"].as_str().unwrap_or_default().to_string(),
        r["error_class"].as_str().map(str::to_string),
        r["reward"].as_f64(),
    )
}

fn ok(reward: f64) -> (String, Option<String>, Option<f64>) {
    ("ok".into(), None, Some(reward))
}

fn failed(class: &str, reward: Option<f64>) -> (String, Option<String>, Option<f64>) {
    ("failed".into(), Some(class.into()), reward)
}

/// result.json counts the calls the default seccomp policy denied in the
/// rollout, the agent's and the verifier's together; unconfined it has
/// none.
#[test]
fn result_json_counts_the_seccomp_policys_denials() {
    let env = Env::with_evalbase();
    env.task(
        "denied",
        "",
        "#!/bin/bash\nsifbox-probe attack keyring >/dev/null\nsifbox-probe attack keyring >/dev/null\n",
        "#!/bin/bash\nsifbox-probe attack keyring >/dev/null\necho 1 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "policy", &tasks]).output().success();
    let r = env.result("policy", "denied__1");
    assert_eq!(r["reward"], 1.0, "{r:#}");
    assert_eq!(
        r["seccomp_denied"],
        serde_json::json!([{"syscall": "keyctl", "count": 3}]),
        "{r:#}"
    );
    env.eval(&["--job", "unconfined", "--seccomp", "unconfined", &tasks])
        .output()
        .success();
    let r = env.result("unconfined", "denied__1");
    assert_eq!(r["reward"], 1.0, "{r:#}");
    assert!(r.get("seccomp_denied").is_none(), "{r:#}");
}

/// `eval --host-ca=FILE` (or SIFBOX_HOST_CA) shows the host's CA bundle to
/// the agent and the verifier, with SSL_CERT_FILE and the like pointing at
/// it; without it they see none. A missing file is bad input.
#[test]
fn host_ca_reaches_agents_and_verifiers() {
    let env = Env::with_evalbase();
    let ca = env.path("my-ca.crt");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nsifbox test\n").expect("write");
    let check = "test \"$SSL_CERT_FILE\" = /run/sifbox/host-ca.crt && test \"$REQUESTS_CA_BUNDLE\" = /run/sifbox/host-ca.crt && grep -q 'sifbox test' \"$SSL_CERT_FILE\"";
    env.task(
        "ca",
        "",
        &format!("#!/bin/bash\n{check} && touch /tmp/agent-saw-ca\n"),
        &format!("#!/bin/bash\nif test -e /tmp/agent-saw-ca && {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"),
    );
    let tasks = env.path("tasks").display().to_string();
    let flag = format!("--host-ca={}", ca.display());
    env.eval(&["--job", "with", &flag, &tasks])
        .output()
        .success();
    assert_eq!(env.result("with", "ca__1")["reward"], 1.0);
    env.eval(&["--job", "by-env", &tasks])
        .env("SIFBOX_HOST_CA", &ca)
        .output()
        .success();
    assert_eq!(env.result("by-env", "ca__1")["reward"], 1.0);
    env.eval(&["--job", "without", &tasks]).output().success();
    assert_eq!(env.result("without", "ca__1")["reward"], 0.0);
    let missing = env.path("no-such.crt");
    env.eval(&[
        "--job",
        "bad",
        &format!("--host-ca={}", missing.display()),
        &tasks,
    ])
    .output()
    .sifbox_error()
    .stderr_has("no such file");
}

/// A rollout's sandbox is stopped before its result is written: what the
/// agent and the verifier left running in the background (in sessions of
/// their own) writes nothing after result.json, nor after the job; the
/// supervisors' unmounting, finished beside the next rollouts, is done
/// when `eval` returns (nothing is left).
#[test]
fn nothing_of_a_rollout_runs_once_its_result_is_written() {
    let env = Env::with_evalbase();
    let ticker = |file: &str| {
        format!(
            "setsid sh -c 'while :; do echo tick >> {file}; done' </dev/null >/dev/null 2>&1 &\n\
             while ! test -s {file}; do :; done\n"
        )
    };
    env.task(
        "ticker",
        "",
        &format!("#!/bin/sh\n{}", ticker("/logs/agent/ticks")),
        &format!(
            "#!/bin/sh\n{}echo 1 > /logs/verifier/reward.txt\n",
            ticker("/logs/verifier/ticks")
        ),
    );
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "j", "--attempts", "4", "--jobs", "2", &tasks])
        .timeout(EVAL_TIMEOUT)
        .output()
        .success();
    let mtime = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut sizes = Vec::new();
    for n in 1..=4 {
        let rollout = format!("ticker__{n}");
        assert_eq!(env.result("j", &rollout)["reward"], 1.0, "{rollout}");
        let dir = env.out().join("j").join(&rollout);
        let result = mtime(&dir.join("result.json"));
        for ticks in [dir.join("agent/ticks"), dir.join("verifier/ticks")] {
            assert!(size(&ticks) > 0, "{}: nothing ran", ticks.display());
            assert!(
                mtime(&ticks) <= result,
                "{} was written after result.json",
                ticks.display()
            );
            sizes.push((ticks.clone(), size(&ticks)));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    for (ticks, was) in sizes {
        assert_eq!(size(&ticks), was, "{} grew after the job", ticks.display());
    }
}

/// A task's scripts go to the sandbox executable, whatever their mode in
/// the task: a `solve.sh`/`test.sh` that is a file (0644) goes in its
/// dir's one transfer, one that is a symlink to a file beside the dirs
/// runs as that file.
#[test]
fn task_scripts_run_whether_files_or_symlinks() {
    let env = Env::with_evalbase();
    env.task(
        "files",
        "",
        "#!/bin/sh\necho solved > /logs/agent/done\n",
        "#!/bin/sh\ntest -x /tests/test.sh && test -x /solution/solve.sh && grep -q solved /logs/agent/done && echo 1 > /logs/verifier/reward.txt\n",
    );
    let linked = env.task("linked", "", "", "");
    for (script, text) in [
        ("solution/solve.sh", "#!/bin/sh\necho solved > /logs/agent/done\n"),
        (
            "tests/test.sh",
            "#!/bin/sh\ntest -f /tests/test.sh && test ! -L /tests/test.sh && test -x /tests/test.sh && grep -q solved /logs/agent/done && echo 1 > /logs/verifier/reward.txt\n",
        ),
    ] {
        let shared = linked.join("shared").join(script.replace('/', "-"));
        std::fs::create_dir_all(shared.parent().expect("parent")).expect("mkdir");
        std::fs::write(&shared, text).expect("write");
        let at = linked.join(script);
        std::fs::remove_file(&at).expect("rm");
        std::os::unix::fs::symlink(
            Path::new("../shared").join(shared.file_name().expect("name")),
            &at,
        )
        .expect("symlink");
    }
    let tasks = env.path("tasks");
    not_executable(&tasks);
    let t = tasks.display().to_string();
    env.eval(&["--job", "j", &t]).output().success();
    assert_eq!(outcome(&env.result("j", "files__1")), ok(1.0));
    assert_eq!(outcome(&env.result("j", "linked__1")), ok(1.0));
}

/// `eval --bind SRC:DST[:ro]` shows a host dir (a dataset, a cache) to
/// every rollout; `:ro` keeps it read-only; a bad bind is bad input.
#[test]
fn eval_binds_host_paths_into_rollouts() {
    let env = Env::with_evalbase();
    let data = env.path("dataset");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::write(data.join("answer.txt"), "42\n").expect("write");
    env.task(
        "bound",
        "",
        "#!/bin/bash\ncp /data/answer.txt /tmp/answer; echo x > /data/new || echo ro > /tmp/ro\n",
        "#!/bin/bash\nif [ \"$(cat /tmp/answer /tmp/ro)\" = \"$(printf '42\\nro')\" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    let bind = format!("{}:/data:ro", data.display());
    env.eval(&["--job", "b", "--bind", &bind, &tasks])
        .output()
        .success();
    assert_eq!(env.result("b", "bound__1")["reward"], 1.0);
    assert!(!data.join("new").exists());
    env.eval(&["--job", "bad", "--bind", "relative:/data", &tasks])
        .output()
        .sifbox_error();
}

/// Figures a paper can cite: a built task's overhead leaves the build out;
/// each result names its sifbox; the summary says how its mean counts and
/// gives Harbor's mean and pass@k.
#[test]
fn results_carry_citable_figures() {
    let env = Env::with_evalbase();
    env.write(
        "tasks/built/environment/Dockerfile",
        "FROM evalbase\nRUN sleep 1 && echo built > /built\n",
    );
    env.task(
        "built",
        "[environment]\n#dockerfile\n",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "nothing",
        "",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "f", "-k", "2", &tasks])
        .output()
        .success();
    let version = env.cmd(&["--version"]).output();
    for attempt in 1..=2 {
        let r = env.result("f", &format!("built__{attempt}"));
        let t = &r["timings_ms"];
        let (total, build, agent, verifier) = (
            t["total"].as_u64().unwrap_or_default(),
            t["build"].as_u64().unwrap_or_default(),
            t["agent"].as_u64().unwrap_or_default(),
            t["verifier"].as_u64().unwrap_or_default(),
        );
        assert_eq!(
            r["overhead_ms"].as_u64(),
            Some(total - build - agent - verifier),
            "{r:#}"
        );
        if attempt == 1 {
            assert!(
                build >= 1000,
                "the first rollout waited for the build: {r:#}"
            );
        }
        let v = r["sifbox_version"].as_str().unwrap_or_default();
        assert!(!v.is_empty() && version.stdout.contains(v), "{r:#}");
        assert!(r["image"]["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")));
    }
    let s = env.json("f/summary.json");
    assert_eq!(s["mean_reward"], 0.5, "{s:#}");
    assert_eq!(s["mean_reward_verified"], 0.5, "{s:#}");
    assert!(s["mean_reward_rule"]
        .as_str()
        .is_some_and(|r| r.contains("counts as 0")));
    assert_eq!(s["pass_at_k"], serde_json::json!({"2": 0.5}), "{s:#}");
}

/// With two workers and two tasks to build, the second worker builds the
/// second task while the first builds the first (it used to wait for the
/// first task's build, to run its second attempt): the builds overlap.
#[test]
fn workers_build_other_tasks_instead_of_waiting() {
    let env = Env::with_evalbase();
    for t in ["slow-a", "slow-b"] {
        env.write(
            &format!("tasks/{t}/environment/Dockerfile"),
            &format!(
                "FROM evalbase\nRUN echo {t} && date +%s > /t0 && sleep 3 && date +%s > /t1\n"
            ),
        );
        env.task(
            t,
            "[environment]\n#dockerfile\n",
            "#!/bin/bash\ntrue\n",
            "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        );
    }
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "s", "-j", "2", "-k", "2", &tasks])
        .output()
        .success();
    let span = |t: &str| -> (u128, u128) {
        let out = env
            .cmd(&[
                "run",
                "--entrypoint",
                "",
                &format!("eval/{t}"),
                "cat",
                "/t0",
                "/t1",
            ])
            .output();
        out.success();
        let v: Vec<u128> = out
            .stdout
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        assert_eq!(v.len(), 2, "{}", out.stdout);
        (v[0], v[1])
    };
    let (a, b) = (span("slow-a"), span("slow-b"));
    assert!(
        a.0 < b.1 && b.0 < a.1,
        "the builds ran one after the other: {a:?} {b:?}"
    );
    let s = env.json("s/summary.json");
    assert_eq!(s["mean_reward"], 1.0, "{s:#}");
}

/// A task's build cache is its own, even under a shared `id=`: one task
/// plants nothing (the audit: a wheel) in another's cache mounts.
#[test]
fn tasks_do_not_share_build_cache_mounts() {
    let env = Env::with_evalbase();
    for t in ["plant", "victim"] {
        env.write(
            &format!("tasks/{t}/environment/Dockerfile"),
            &format!(
                "FROM evalbase\n\
RUN --mount=type=cache,id=pip,target=/c --mount=type=cache,target=/root/.cache \
sh -c 'ls /c /root/.cache > /seen; echo {t} > /c/{t}.whl; echo {t} > /root/.cache/{t}.whl'\n"
            ),
        );
        env.task(
            t,
            "[environment]\n#dockerfile\n",
            "#!/bin/bash\ntrue\n",
            "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        );
    }
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "c", "-j", "1", &tasks])
        .output()
        .success();
    for t in ["plant", "victim"] {
        let out = env
            .cmd(&[
                "run",
                "--entrypoint",
                "",
                &format!("eval/{t}"),
                "cat",
                "/seen",
            ])
            .output();
        out.success();
        assert!(
            !out.stdout.contains(".whl"),
            "{t} saw another task's cache: {}",
            out.stdout
        );
    }
}

#[test]
fn example_suite_gives_the_expected_rewards() {
    let tar = debian_tar();
    let tasks = example_tasks();
    assert!(tasks.is_dir(), "{} is missing", tasks.display());
    let env = Env::new();
    env.store
        .import(&tar, "debian:bookworm")
        .timeout(Duration::from_secs(300))
        .output()
        .success();
    let tasks = tasks.display().to_string();
    let out = env
        .eval(&["--job", "oracle", "--jobs", "2", &tasks])
        .timeout(Duration::from_secs(1200))
        .output();
    out.success();
    let expected = [
        ("background-service", ok(1.0)),
        ("compile-c", ok(1.0)),
        ("edit-files", ok(1.0)),
        ("failing-solution", ok(0.0)),
        ("no-network", ok(1.0)),
        ("verifier-timeout", failed("verifier_timeout", None)),
    ];
    for (task, want) in &expected {
        let r = env.result("oracle", &format!("{task}__1"));
        assert_eq!(&outcome(&r), want, "{task}: {r:#}\n{}", out.stderr);
        assert!(
            r["image"]["digest"]
                .as_str()
                .is_some_and(|d| d.starts_with("sha256:")),
            "{r:#}"
        );
        let dir = env.out().join("oracle").join(format!("{task}__1"));
        for f in [
            "sandbox.json",
            "build.log",
            "agent/oracle.txt",
            "verifier/test-stdout.txt",
        ] {
            assert!(dir.join(f).is_file(), "{task}: no {f}");
        }
        assert!(dir.join("artifacts").is_dir(), "{task}: no artifacts/");
    }
    // The phase overrides of compile-c: a sandbox with the host's network,
    // an agent and a verifier without.
    let c = env.result("oracle", "compile-c__1");
    assert_eq!(c["agent_run"]["network"], "no-network", "{c:#}");
    assert_eq!(c["verifier_run"]["network"], "no-network", "{c:#}");
    let evidence = env.json("oracle/compile-c__1/sandbox.json");
    assert_eq!(evidence["network"], "host", "{evidence:#}");
    let s = env.json("oracle/summary.json");
    assert_eq!(s["rollouts"], 6);
    assert_eq!(s["finished"], 6);
    assert_eq!(s["failures"]["verifier_timeout"], 1, "{s:#}");
    assert!(
        (s["mean_reward"].as_f64().expect("a mean") - 4.0 / 6.0).abs() < 1e-9,
        "{s:#}"
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("total") && l.contains("0.667") && l.contains("6/6")),
        "{}",
        out.stdout
    );
    // The verifier that timed out left nothing running: its very argv
    // (other tests' numeric markers may contain "300") in a pid namespace
    // of a sandbox, not the host's (where anything else on the machine,
    // a developer's shell too, may be sleeping 300 s).
    let host_ns = harness::host_namespace("pid");
    let left: Vec<String> = processes_with_arg("300")
        .into_iter()
        .filter(|(pid, argv)| {
            argv == &["sleep", "300"]
                && std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                    .is_ok_and(|ns| ns.to_string_lossy() != host_ns)
        })
        .map(|(pid, _)| harness::describe_process(pid))
        .collect();
    assert!(left.is_empty(), "the timed-out verifier left {left:#?}");

    // The same suite with the nop agent: the images come from the cache,
    // and no task passes without its solution.
    let out = env
        .eval(&["--job", "nop", "--agent", "nop", "--jobs", "2", &tasks])
        .timeout(Duration::from_secs(300))
        .output();
    out.success();
    for (task, _) in &expected {
        let r = env.result("nop", &format!("{task}__1"));
        let want = if *task == "verifier-timeout" {
            failed("verifier_timeout", None)
        } else {
            ok(0.0)
        };
        assert_eq!(outcome(&r), want, "{task} with nop: {r:#}");
        assert!(r["agent_run"].is_null(), "{r:#}");
    }
    assert!(
        out.stderr
            .lines()
            .filter(|l| l.starts_with("built "))
            .count()
            == 6,
        "{}",
        out.stderr
    );
    // apt's build step wrote files of subordinate ids that only a sandbox
    // can remove: empty the build cache so that the test's store goes.
    env.cmd(&["gc", "--build-cache"]).output().success();
}

#[test]
fn agents_limits_networks_users_env_and_healthchecks() {
    let env = Env::with_evalbase();
    let reward = |x: &str| format!("#!/bin/bash\necho {x} > /logs/verifier/reward.txt\n");
    env.task(
        "agent-timeout",
        "[agent]\ntimeout_sec = 1\n",
        "#!/bin/bash\nsleep 100 &\nsleep 100\n",
        &reward("1"),
    );
    env.task(
        "agent-fails",
        "",
        "#!/bin/bash\necho failing; exit 3\n",
        "#!/bin/bash\necho '{\"reward\": 0.5, \"checks\": 2}' > /logs/verifier/reward.json\necho 0 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "no-reward",
        "",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\necho nothing to see\nexit 0\n",
    );
    env.task(
        "cheating-agent",
        "",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nexit 0\n",
        "#!/bin/bash\n[[ -e /logs/verifier/reward.txt ]] && exit 1\necho 0 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "phase-net",
        "[agent]\nnetwork_mode = \"no-network\"\n",
        "#!/bin/bash\ntail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > /logs/agent/ifaces\n",
        "#!/bin/bash\ntail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > /logs/verifier/ifaces\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "users",
        "[agent]\nuser = \"user\"\n[verifier]\nuser = \"1000:1000\"\n",
        "#!/bin/bash\n{ id -u; stat -c %u /instruction.md /solution/solve.sh; } > /logs/agent/who\n",
        "#!/bin/bash\n{ id -u; stat -c %u /tests/test.sh; } > /logs/verifier/who\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "env-and-workdir",
        "[environment]\nworkdir = \"/work/here\"\nenv = { GREETING = \"${EVAL_TEST_GREETING:-unset}\", FALLBACK = \"${EVAL_TEST_NOT_SET:-dflt}\" }\n[verifier]\nenv = { MODE = \"strict\" }\n[solution]\nenv = { HINT = \"h\" }\n",
        "#!/bin/bash\necho \"$PWD $GREETING $FALLBACK $HINT ${MODE:-none}\" > /logs/agent/seen\n",
        "#!/bin/bash\necho \"$PWD $GREETING $FALLBACK ${HINT:-none} $MODE\" > /logs/verifier/seen\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "unhealthy",
        "[environment]\nhealthcheck = { command = \"echo not yet; false\", interval_sec = 0.1, retries = 2 }\n",
        "#!/bin/bash\ntrue\n",
        &reward("1"),
    );
    env.task(
        "healthy",
        "[environment]\nhealthcheck = { command = \"test -x /bin/bash\", interval_sec = 0.1 }\n",
        "#!/bin/bash\ntrue\n",
        &reward("1"),
    );
    let tasks = env.path("tasks").display().to_string();
    let out = env
        .eval(&[
            "--job",
            "j",
            "--jobs",
            "3",
            "--pass-env",
            "EVAL_TEST_GREETING",
            &tasks,
        ])
        .env("EVAL_TEST_GREETING", "hello-from-host")
        .output();
    out.success();
    let r = |t: &str| env.result("j", &format!("{t}__1"));
    let read = |rel: &str| {
        std::fs::read_to_string(env.out().join("j").join(rel))
            .unwrap_or_else(|e| panic!("reading {rel}: {e}"))
    };

    let t = r("agent-timeout");
    assert_eq!(outcome(&t), failed("agent_timeout", Some(1.0)), "{t:#}");
    assert_eq!(t["agent_run"]["exit_code"], 124, "{t:#}");
    assert!(
        t["timings_ms"]["agent"].as_u64().expect("ms") < 5000,
        "{t:#}"
    );
    let t = r("agent-fails");
    assert_eq!(outcome(&t), failed("agent_failed", Some(0.5)), "{t:#}");
    assert_eq!(t["reward_source"], "reward.json");
    assert_eq!(t["rewards"]["checks"], 2);
    assert_eq!(read("agent-fails__1/agent/oracle.txt"), "failing\n");
    let t = r("no-reward");
    assert_eq!(outcome(&t), failed("verifier_failed", None), "{t:#}");
    assert!(
        t["error"].as_str().expect("error").contains("reward"),
        "{t:#}"
    );
    assert_eq!(
        read("no-reward__1/verifier/test-stdout.txt"),
        "nothing to see\n"
    );
    // Its write to /logs/verifier was refused (read-only to the agent):
    // nothing there to remove, no note.
    let t = r("cheating-agent");
    assert_eq!(outcome(&t), ok(0.0), "{t:#}");
    assert_eq!(
        notes(&t).iter().filter(|n| !is_limit_note(n)).count(),
        0,
        "{t:#}"
    );

    let t = r("phase-net");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(read("phase-net__1/agent/ifaces"), "lo\n");
    let host_ifaces = std::fs::read_to_string("/proc/net/dev").expect("/proc/net/dev");
    assert_eq!(
        read("phase-net__1/verifier/ifaces").lines().count(),
        host_ifaces.lines().count() - 2,
        "the verifier has the host's network"
    );
    assert_eq!(t["agent_run"]["network"], "no-network");
    assert_eq!(t["verifier_run"]["network"], "public");

    let t = r("users");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(read("users__1/agent/who"), "1000\n1000\n1000\n");
    assert_eq!(read("users__1/verifier/who"), "1000\n1000\n");
    assert_eq!(t["agent_run"]["user"], "user");

    let t = r("env-and-workdir");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(
        read("env-and-workdir__1/agent/seen"),
        "/work/here hello-from-host dflt h none\n"
    );
    assert_eq!(
        read("env-and-workdir__1/verifier/seen"),
        "/work/here hello-from-host dflt none strict\n"
    );

    let t = r("unhealthy");
    assert_eq!(outcome(&t), failed("start_failed", None), "{t:#}");
    let e = t["error"].as_str().expect("error");
    assert!(e.contains("healthcheck") && e.contains("not yet"), "{e}");
    assert!(t["agent_run"].is_null(), "{t:#}");
    assert_eq!(outcome(&r("healthy")), ok(1.0));

    let s = env.json("j/summary.json");
    assert_eq!(s["finished"], 9, "{s:#}");
    assert_eq!(s["infra_errors"], 0, "{s:#}");
    assert_eq!(s["failures"]["agent_timeout"], 1, "{s:#}");
    assert!(out.stdout.contains("agent-timeout"), "{}", out.stdout);

    // A command as the agent, with the instruction in a variable; --filter
    // and --net none.
    let out = env
        .eval(&[
            "--job",
            "cmd",
            "--agent",
            "cmd:printf '%s|' \"$SIFBOX_INSTRUCTION\" > /logs/agent/got; cat /instruction.md >> /logs/agent/got; tail -n +3 /proc/net/dev | wc -l >> /logs/agent/got",
            "--filter",
            "heal*",
            "--net",
            "none",
            &tasks,
        ])
        .output();
    out.success();
    let s = env.json("cmd/summary.json");
    assert_eq!(s["rollouts"], 1, "only the filtered task: {s:#}");
    assert_eq!(
        read("../cmd/healthy__1/agent/got"),
        "The instruction of healthy.\n|The instruction of healthy.\n1\n"
    );
    assert_eq!(env.result("cmd", "healthy__1")["agent"], "cmd:printf '%s|' \"$SIFBOX_INSTRUCTION\" > /logs/agent/got; cat /instruction.md >> /logs/agent/got; tail -n +3 /proc/net/dev | wc -l >> /logs/agent/got");
}

#[test]
fn broken_dockerfile_is_build_failed_with_the_build_error() {
    let env = Env::with_evalbase();
    env.task(
        "broken",
        "#dockerfile\n[agent]\ntimeout_sec = 10\n",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.write(
        "tasks/broken/environment/Dockerfile",
        "FROM evalbase\nRUN echo about to fail && exit 3\n",
    );
    env.task(
        "fine",
        "#dockerfile\n",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.write(
        "tasks/fine/environment/Dockerfile",
        "FROM evalbase\nRUN echo built > /built\n",
    );
    let nap = unique_number();
    env.task(
        "slow-build",
        "#dockerfile\n[environment]\nbuild_timeout_sec = 1\n",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.write(
        "tasks/slow-build/environment/Dockerfile",
        &format!("FROM evalbase\nRUN sleep {nap}\n"),
    );
    let tasks = env.path("tasks").display().to_string();
    let out = env
        .eval(&["--job", "b", "--attempts", "2", &tasks])
        .output();
    // Every rollout ran (a broken task is a result, not an error of sifbox).
    out.success();
    for attempt in 1..=2 {
        let r = env.result("b", &format!("broken__{attempt}"));
        assert_eq!(outcome(&r), failed("build_failed", None), "{r:#}");
        let e = r["error"].as_str().expect("an error");
        assert!(
            e.contains("Dockerfile:2") && e.contains("code 3") && e.contains("about to fail"),
            "{e}"
        );
        assert!(
            r["sandbox"].is_null(),
            "no sandbox for a failed build: {r:#}"
        );
        let log = std::fs::read_to_string(env.out().join(format!("b/broken__{attempt}/build.log")))
            .expect("build.log");
        assert!(
            log.contains("about to fail") && log.contains("ERROR"),
            "{log}"
        );
        assert_eq!(
            outcome(&env.result("b", &format!("fine__{attempt}"))),
            ok(1.0)
        );
    }
    // A build past its time limit is stopped, with nothing left running.
    let r = env.result("b", "slow-build__1");
    assert_eq!(outcome(&r), failed("build_failed", None), "{r:#}");
    assert!(
        r["error"]
            .as_str()
            .expect("error")
            .contains("build_timeout_sec (1 s)"),
        "{r:#}"
    );
    assert!(
        r["timings_ms"]["build"].as_u64().expect("ms") < 20_000,
        "{r:#}"
    );
    assert_eq!(processes_with_arg(&nap.to_string()), Vec::new());
    // One build per environment, shared by its rollouts.
    let log = std::fs::read_to_string(env.out().join("b/builds/broken.log")).expect("log");
    assert_eq!(log.matches("# sifbox build").count(), 1, "{log}");
    let s = env.json("b/summary.json");
    assert_eq!(s["failures"]["build_failed"], 4, "{s:#}");
    assert!(out.stdout.contains("build_failed 2"), "{}", out.stdout);
}

#[test]
fn ctrl_c_stops_every_sandbox_and_resume_completes_the_rest() {
    let env = Env::with_evalbase();
    let nap = unique_number();
    let token = unique("secret-token");
    env.task(
        "a-quick",
        "",
        "#!/bin/bash\necho done > /tmp/done\n",
        "#!/bin/bash\n[[ -e /tmp/done ]] && echo 1 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "b-slow",
        "[environment]\nenv = { NAP = \"${EVAL_TEST_NAP}\", TOKEN = \"${EVAL_TEST_TOKEN}\" }\n",
        "#!/bin/bash\n[[ $TOKEN == secret-token-* ]] && echo token-ok > /logs/agent/token\nsleep \"$NAP\" &\nwait\n",
        "#!/bin/bash\n[[ -e /logs/agent/token ]] && echo 1 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    let is_nap = |(_, argv): &(i32, Vec<String>)| {
        argv.first().is_some_and(|a| a.ends_with("sleep")) && argv.get(1) == Some(&nap.to_string())
    };
    let running = env
        .eval(&[
            "--job",
            "r",
            "--attempts",
            "2",
            "--jobs",
            "2",
            "--pass-env",
            "EVAL_TEST_NAP",
            "--pass-env",
            "EVAL_TEST_TOKEN",
            &tasks,
        ])
        .env("EVAL_TEST_NAP", nap.to_string())
        .env("EVAL_TEST_TOKEN", &token)
        .spawn();
    assert!(
        eventually(Duration::from_secs(60), || {
            processes_with_arg(&nap.to_string())
                .iter()
                .filter(|p| is_nap(p))
                .count()
                == 2
        }),
        "the two slow rollouts did not start"
    );
    // The secret is in no command line of the host.
    assert_eq!(processes_with_arg(&token), Vec::new());
    running.signal(rustix::process::Signal::INT);
    let out = running.wait();
    out.code_is(130);
    env.store.sb.assert_clean();
    assert!(
        eventually(Duration::from_secs(5), || processes_with_arg(
            &nap.to_string()
        )
        .iter()
        .all(|p| !is_nap(p))),
        "sleeps of the interrupted rollouts survived: {:?}",
        processes_with_arg(&nap.to_string())
    );
    for attempt in 1..=2 {
        assert_eq!(
            outcome(&env.result("r", &format!("a-quick__{attempt}"))),
            ok(1.0)
        );
        let r = env.result("r", &format!("b-slow__{attempt}"));
        assert_eq!(r["status"], "interrupted", "{r:#}");
    }
    let s = env.json("r/summary.json");
    assert_eq!(
        (s["finished"].as_u64(), s["interrupted"].as_u64()),
        (Some(2), Some(2)),
        "{s:#}"
    );
    assert!(out.stdout.contains("interrupted 2"), "{}", out.stdout);
    let before = env.result("r", "a-quick__1");

    // --resume runs what did not finish, and only that.
    let out = env
        .eval(&[
            "--job",
            "r",
            "--attempts",
            "2",
            "--jobs",
            "2",
            "--resume",
            "--pass-env",
            "EVAL_TEST_NAP",
            "--pass-env",
            "EVAL_TEST_TOKEN",
            &tasks,
        ])
        .env("EVAL_TEST_NAP", "0")
        .env("EVAL_TEST_TOKEN", &token)
        .output();
    out.success();
    assert_eq!(
        env.result("r", "a-quick__1"),
        before,
        "a finished rollout was run again"
    );
    for attempt in 1..=2 {
        let r = env.result("r", &format!("b-slow__{attempt}"));
        assert_eq!(outcome(&r), ok(1.0), "{r:#}");
    }
    let s = env.json("r/summary.json");
    assert_eq!(
        (s["finished"].as_u64(), s["ran_now"].as_u64()),
        (Some(4), Some(2)),
        "{s:#}"
    );
    assert_eq!(s["mean_reward"], 1.0);
    // Nor is the secret in any file of the job.
    let mut files = vec![env.out()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(
                std::fs::read_dir(&p)
                    .expect("ls")
                    .map(|e| e.expect("entry").path()),
            );
        } else {
            let data = std::fs::read(&p).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&data).contains(&token),
                "the secret is in {}",
                p.display()
            );
        }
    }
    // A job that exists is not started again by mistake.
    env.eval(&[
        "--job",
        "r",
        "--pass-env",
        "EVAL_TEST_NAP",
        "--pass-env",
        "EVAL_TEST_TOKEN",
        &tasks,
    ])
    .env("EVAL_TEST_NAP", "0")
    .env("EVAL_TEST_TOKEN", &token)
    .output()
    .sifbox_error()
    .stderr_has("--resume");
}

#[test]
fn bad_input_is_one_clear_error_and_leaves_nothing() {
    let env = Env::new();
    let good = env.task(
        "good",
        "",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    let good = good.display().to_string();
    env.write("empty/README", "no tasks here\n");
    env.write("badtoml/task.toml", "[agent]\ntimeout_sec = \"soon\"\n");
    env.write("badtoml/instruction.md", "x");
    let unset = env.task(
        "unset",
        "[environment]\nenv = { KEY = \"${EVAL_TEST_SURELY_UNSET}\" }\n",
        "#!/bin/bash\ntrue\n",
        "#!/bin/bash\ntrue\n",
    );
    let empty = env.path("empty").display().to_string();
    let badtoml = env.path("badtoml").display().to_string();
    let unset = unset.display().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![&empty], "task.toml"),
        (vec![&badtoml], "task.toml:2"),
        (vec!["/nonexistent-task-dir"], "no such directory"),
        (vec!["--agent", "claude-code", &good], "not an agent"),
        (vec![&unset], "EVAL_TEST_SURELY_UNSET"),
        (vec!["--resume", &good], "--job"),
        (vec!["--filter", "zzz*", &good], "--filter"),
        (vec!["--attempts", "0", &good], "--attempts"),
        (vec!["--job", "../up", &good], "--job"),
        (vec!["--progress", "loud", &good], "--progress"),
        (
            vec!["--override-memory-mb", "0", &good],
            "--override-memory-mb",
        ),
        (vec!["--override-cpus", "0", &good], "--override-cpus"),
        (
            vec!["--override-storage-mb", "0", &good],
            "--override-storage-mb",
        ),
        (vec!["--pids", "0", &good], "--pids"),
    ];
    for (args, needle) in cases {
        let out_dir = env.out().display().to_string();
        let mut all = vec!["eval", "--out", &out_dir];
        all.extend_from_slice(&args);
        let out = env.cmd(&all).env_remove("EVAL_TEST_SURELY_UNSET").output();
        out.sifbox_error().stderr_has(needle);
        let left: Vec<_> = std::fs::read_dir(env.out())
            .map(|rd| rd.map(|e| e.expect("entry").path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

// ===========================================================================
// Resource limits (issue 13): what task.toml asks for, sifbox's defaults,
// the job's overrides, and the records of what was enforced and used.
// ===========================================================================

/// The mechanisms the engine may name for a limit.
const HOWS: [&str; 5] = ["cgroup_v2", "cgroup_v1", "rlimit", "watchdog", "affinity"];

/// `limits_applied`'s entry for `limit`, if any.
pub(crate) fn applied<'a>(r: &'a Value, limit: &str) -> Option<&'a Value> {
    r["limits_applied"]
        .as_array()
        .expect("limits_applied is a list")
        .iter()
        .find(|a| a["limit"] == limit)
}

/// A note on a limit this host does not enforce (which ones depends on
/// the host and the caller).
/// A note every rollout of a job gets (a limit this host cannot enforce,
/// the variables passed), not one about the rollout itself.
fn is_limit_note(n: &str) -> bool {
    n.starts_with("limit not enforced: ") || n.starts_with("the caller's environment variables")
}

fn notes(r: &Value) -> Vec<String> {
    r["notes"]
        .as_array()
        .expect("notes is a list")
        .iter()
        .map(|n| n.as_str().expect("a note is text").to_string())
        .collect()
}

/// Asserts that `limit` (asked for with `value` in `unit`s) is either
/// enforced, by a mechanism the engine names, at `value` or above (CPU
/// affinity rounds up), or said in a note not to be: never dropped.
fn enforced_or_noted(r: &Value, limit: &str, value: u64) {
    match applied(r, limit) {
        Some(a) => {
            let how = a["how"].as_str().expect("how");
            assert!(HOWS.contains(&how), "{limit}: {a}");
            let v = a["value"].as_u64().expect("value");
            assert!(v >= value, "{limit} enforced at {v}, asked {value}: {a}");
            if limit != "cpus" {
                assert_eq!(v, value, "{a}");
            }
            assert!(!a["detail"].as_str().expect("detail").is_empty(), "{a}");
        }
        None => assert!(
            notes(r)
                .iter()
                .any(|n| n.starts_with(&format!("limit not enforced: {limit}"))),
            "{limit} is neither enforced nor noted: {r:#}"
        ),
    }
}

/// `--layer`: as root, `tmpfs` and `disk` put the writable layer where they
/// say (recorded); as another user `disk` is bad input, refused before
/// anything runs.
#[test]
fn the_layer_option_says_where_writes_go() {
    let env = Env::with_evalbase();
    let solve = "#!/bin/bash
echo hi > /root/f
";
    let reward = "#!/bin/bash
echo 1 > /logs/verifier/reward.txt
";
    env.task(
        "layer",
        "[environment]
storage_mb = 64
",
        solve,
        reward,
    );
    let tasks = env.path("tasks").display().to_string();
    if !harness::disk_layers() {
        let out = env.eval(&["--layer", "disk", &tasks]).output();
        out.sifbox_error().stderr_has("--layer disk");
        assert!(!env.out().exists() || std::fs::read_dir(env.out()).expect("out").count() == 0);
        return;
    }
    for layer in ["tmpfs", "disk"] {
        env.eval(&["--job", layer, "--layer", layer, &tasks])
            .output()
            .success();
        let r = env.result(layer, "layer__1");
        assert_eq!(outcome(&r), ok(1.0), "{r:#}");
        let storage = applied(&r, "storage").expect("storage");
        assert_eq!(storage["how"], layer, "{storage}");
        assert_eq!(storage["value"], 64u64 << 20, "{storage}");
    }
}

#[test]
fn task_limits_defaults_and_overrides_are_recorded_with_what_enforced_them() {
    let env = Env::with_evalbase();
    // Fills its writable layer past storage_mb, and burns some CPU.
    // (/logs/agent is in the same layer: dd's output is kept in memory
    // until /big is gone.)
    let solve = "#!/bin/bash\nerr=$(dd if=/dev/zero of=/big bs=1M count=80 2>&1)\nrc=$?\nrm -f /big\necho \"$err\" > /logs/agent/dd.err\necho $rc > /logs/agent/dd.rc\ni=0; while [ $i -lt 100000 ]; do i=$((i+1)); done\n";
    let reward = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n";
    env.task(
        "sized",
        "[environment]\ncpus = 1.5\nmemory_mb = 512\nstorage = \"64M\"\ngpus = 1\ngpu_types = [\"H100\"]\n",
        solve,
        reward,
    );
    env.task("plain", "", solve, reward);
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "l", "--jobs", "2", &tasks])
        .output()
        .success();
    let read = |rel: &str| {
        std::fs::read_to_string(env.out().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };

    let r = env.result("l", "sized__1");
    assert_eq!(outcome(&r), ok(1.0), "{r:#}");
    let l = &r["limits"];
    assert_eq!(l["cpus"], 1.5, "{l}");
    assert_eq!(l["memory_mb"], 512, "{l}");
    assert_eq!(l["storage_mb"], 64, "{l}");
    assert_eq!(l["gpus"], 1, "{l}");
    assert_eq!(l["pids"], 4096, "the default cap: {l}");
    assert_eq!(l["source"]["memory_mb"], "task", "{l}");
    assert_eq!(l["source"]["storage_mb"], "task", "{l}");
    assert_eq!(l["source"]["pids"], "default", "{l}");
    enforced_or_noted(&r, "memory", 512 << 20);
    enforced_or_noted(&r, "cpus", 1500);
    enforced_or_noted(&r, "pids", 4096);
    // Memory always has a mechanism (the watchdog at worst); so do CPUs
    // (affinity).
    assert!(applied(&r, "memory").is_some(), "{r:#}");
    assert!(applied(&r, "cpus").is_some(), "{r:#}");
    // As root the layer is on disk (`--layer auto`), else in memory.
    let storage = applied(&r, "storage").expect("storage");
    let layer = if harness::disk_layers() {
        "disk"
    } else {
        "tmpfs"
    };
    assert_eq!(storage["how"], layer, "{storage}");
    assert_eq!(storage["value"], 64u64 << 20, "{storage}");
    // The writable layer really is that size.
    assert_ne!(read("l/sized__1/agent/dd.rc"), "0\n");
    assert!(
        read("l/sized__1/agent/dd.err").contains("No space left"),
        "{}",
        read("l/sized__1/agent/dd.err")
    );
    let n = notes(&r);
    assert!(
        n.iter()
            .any(|n| n.contains("gpus = 1 (gpu_types H100)") && n.contains("not enforced")),
        "{n:?}"
    );
    // What the phases used: CPU time (the agent's loop) for both.
    let cpu = r["agent_run"]["cpu_seconds"]
        .as_f64()
        .expect("agent cpu_seconds");
    assert!(cpu > 0.0 && cpu < 60.0, "{r:#}");
    assert!(r["verifier_run"]["cpu_seconds"].as_f64().is_some(), "{r:#}");
    for p in ["agent_run", "verifier_run"] {
        assert!(
            r[p]["memory_peak_bytes"].is_u64() || r[p]["memory_peak_bytes"].is_null(),
            "{r:#}"
        );
        assert_eq!(r[p]["oom_kills"], 0, "{r:#}");
    }

    let r = env.result("l", "plain__1");
    assert_eq!(outcome(&r), ok(1.0), "{r:#}");
    let l = &r["limits"];
    assert_eq!(l["memory_mb"], 4096, "the default memory cap: {l}");
    assert_eq!(l["storage_mb"], 10240, "{l}");
    assert_eq!(l["pids"], 4096, "{l}");
    assert!(l["cpus"].is_null() && l["gpus"].is_null(), "{l}");
    assert_eq!(l["source"]["memory_mb"], "default", "{l}");
    enforced_or_noted(&r, "memory", 4096 << 20);
    enforced_or_noted(&r, "pids", 4096);
    assert!(applied(&r, "cpus").is_none(), "no CPU limit asked: {r:#}");
    assert_eq!(
        read("l/plain__1/agent/dd.rc"),
        "0\n",
        "80 MiB fit in 10 GiB"
    );
    assert!(
        !notes(&r).iter().any(|n| n.contains("gpus")),
        "{:?}",
        notes(&r)
    );

    // The job's overrides replace what the tasks say, given or not.
    env.eval(&[
        "--job",
        "o",
        "--override-cpus",
        "1",
        "--override-memory-mb",
        "300",
        "--override-storage-mb",
        "32",
        "--override-gpus",
        "0",
        "--pids",
        "200",
        &tasks,
    ])
    .output()
    .success();
    for t in ["sized", "plain"] {
        let r = env.result("o", &format!("{t}__1"));
        assert_eq!(outcome(&r), ok(1.0), "{r:#}");
        let l = &r["limits"];
        assert_eq!(
            (
                &l["cpus"],
                &l["memory_mb"],
                &l["storage_mb"],
                &l["gpus"],
                &l["pids"]
            ),
            (
                &Value::from(1.0),
                &Value::from(300),
                &Value::from(32),
                &Value::from(0),
                &Value::from(200)
            ),
            "{l}"
        );
        for k in ["cpus", "memory_mb", "storage_mb", "gpus", "pids"] {
            assert_eq!(l["source"][k], "override", "{k}: {l}");
        }
        enforced_or_noted(&r, "memory", 300 << 20);
        enforced_or_noted(&r, "cpus", 1000);
        enforced_or_noted(&r, "pids", 200);
        assert_eq!(
            applied(&r, "storage").expect("storage")["value"],
            32u64 << 20
        );
        assert_ne!(
            read(&format!("o/{t}__1/agent/dd.rc")),
            "0\n",
            "{t}: 80 MiB in 32"
        );
        assert!(
            !notes(&r).iter().any(|n| n.contains("gpus")),
            "gpus = 0 asks for nothing: {:?}",
            notes(&r)
        );
    }
}

#[test]
fn a_memory_hog_ends_oom_while_its_neighbour_gets_its_reward() {
    let env = Env::with_evalbase();
    // busybox tail keeps its one endless line in memory: 600 MiB when
    // nothing stops it (bounded), far past the task's 200.
    env.task(
        "hog",
        "[environment]\nmemory_mb = 200\n",
        "#!/bin/bash\ndd if=/dev/zero bs=1M count=600 2>/dev/null | tail > /dev/null\n",
        "#!/bin/bash\necho ran > /logs/verifier/ran\necho 1 > /logs/verifier/reward.txt\n",
    );
    env.task(
        "neighbour",
        "",
        "#!/bin/bash\necho fine > /logs/agent/done\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "m", "--jobs", "2", &tasks])
        .output()
        .success();
    let r = env.result("m", "hog__1");
    assert_eq!(outcome(&r), failed("oom", None), "{r:#}");
    let e = r["error"].as_str().expect("error");
    assert!(
        e.contains("the agent went over its 200 MiB memory limit") && e.contains("memory_mb"),
        "{e}"
    );
    let a = &r["agent_run"];
    assert!(a["oom_kills"].as_u64().expect("oom_kills") >= 1, "{r:#}");
    assert_ne!(a["exit_code"], 0, "{r:#}");
    let peak = a["memory_peak_bytes"].as_u64().expect("a memory peak");
    assert!(
        peak > 100 << 20 && peak < 590 << 20,
        "killed near its limit, not after all 600 MiB: {peak}"
    );
    // As Harbor: an out-of-memory rollout is not graded.
    assert!(r["verifier_run"].is_null(), "{r:#}");
    assert!(!env.out().join("m/hog__1/verifier/ran").exists());

    let r = env.result("m", "neighbour__1");
    assert_eq!(outcome(&r), ok(1.0), "{r:#}");
    assert_eq!(r["agent_run"]["oom_kills"], 0, "{r:#}");
    assert!(r["agent_run"]["memory_peak_bytes"].is_u64(), "{r:#}");
    let s = env.json("m/summary.json");
    assert_eq!(s["failures"]["oom"], 1, "{s:#}");
    assert_eq!(
        (&s["ok"], &s["failed"]),
        (&Value::from(1), &Value::from(1)),
        "{s:#}"
    );
}

#[test]
fn a_fork_bomb_is_capped_by_the_default_pids_limit_and_all_of_it_killed() {
    let env = Env::with_evalbase();
    // Forks `sleep MARK` until fork fails (busybox sh then exits) or 4500
    // are running (bounded: the host's pid_max is 32768); then kills all
    // but ten, which the sandbox's end must take along.
    let mark = format!("3{:06}", unique_number() % 1_000_000);
    env.task(
        "forker",
        "",
        &format!(
            "#!/bin/bash\n/bin/sh -c 'i=0; while [ $i -lt 4500 ]; do sleep {mark} & echo $! >> /tmp/pids; i=$((i+1)); echo $i > /logs/agent/forked; done'\necho $? > /logs/agent/inner.rc\nn=0\nwhile read p; do n=$((n+1)); [ $n -gt 10 ] && kill -9 $p; done < /tmp/pids\nexit 0\n"
        ),
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "f", &tasks]).output().success();
    let r = env.result("f", "forker__1");
    let read = |rel: &str| {
        std::fs::read_to_string(env.out().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    let forked: u64 = read("f/forker__1/agent/forked")
        .trim()
        .parse()
        .expect("a count");
    assert!(
        forked < 4096 && forked > 1000,
        "the cap of 4096 stopped the bomb: it forked {forked}"
    );
    assert_ne!(read("f/forker__1/agent/inner.rc"), "0\n", "its fork failed");
    assert_eq!(r["limits"]["pids"], 4096, "{r:#}");
    let pids = applied(&r, "pids").expect("pids enforced");
    assert!(HOWS.contains(&pids["how"].as_str().expect("how")), "{pids}");
    // The host stayed usable: the verifier ran and gave its reward.
    assert_eq!(outcome(&r), ok(1.0), "{r:#}");
    assert!(
        eventually(Duration::from_secs(10), || processes_with_arg(&mark)
            .is_empty()),
        "sleeps survived the rollout: {:?}",
        processes_with_arg(&mark).len()
    );
}

// ===========================================================================
// Hostile solutions (issue 12): the agent is root in its sandbox, where
// the rollout dir is bound at /logs; it tries to make the host write
// outside the rollout dir, and to forge the reward.
// ===========================================================================

/// Every path below `dir` (symlinks not followed).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.expect("entry").path();
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[test]
fn hostile_solutions_write_nothing_outside_the_rollout_and_forge_no_reward() {
    let env = Env::with_evalbase();
    // The decoy: an absolute host path the solutions point their symlinks
    // at, holding files named like the ones sifbox writes.
    let decoy = env.path("decoy");
    std::fs::create_dir_all(decoy.join("verifier")).expect("mkdir");
    for f in [
        "test-stdout.txt",
        "oracle.txt",
        "reward.txt",
        "result.json",
        "verifier/test-stdout.txt",
    ] {
        std::fs::write(decoy.join(f), "decoy\n").expect("writing the decoy");
    }
    let d = decoy.display().to_string();
    let verifier = "#!/bin/bash\necho verifier-ran\necho 0.5 > /logs/verifier/reward.txt\n";
    // (a) The logs subdirs replaced by symlinks to the decoy.
    env.task(
        "a-symlinks",
        "",
        &format!(
            "#!/bin/bash\nfor s in verifier agent artifacts; do rm -rf /logs/$s; ln -s {d} /logs/$s; done\nls -l /logs\n"
        ),
        verifier,
    );
    // (b) A process left running that keeps moving verifier/ away and
    // planting symlinks and reward files while the verifier runs; the
    // verifier ends it before it writes its reward.
    env.task(
        "b-lingering",
        "",
        &format!(
            r#"#!/bin/bash
plant() {{
  i=0
  while :; do
    i=$((i+1))
    mv -f /logs/verifier /logs/moved.$i
    ln -sfn {d} /logs/verifier
    ln -sfn {d}/test-stdout.txt /logs/moved.$i/test-stdout.txt
    echo 1.0 > /logs/moved.$i/reward.txt
    sleep 0.02
  done
}}
plant </dev/null >/dev/null 2>&1 &
echo $! > /tmp/planter.pid
sleep 0.1
"#
        ),
        "#!/bin/bash\nsleep 0.5\nkill -9 $(cat /tmp/planter.pid)\nsleep 0.3\nmv /logs/verifier /logs/verifier.planted\nmkdir /logs/verifier\necho verifier-ran\necho 0.5 > /logs/verifier/reward.txt\n",
    );
    // (c) Reward files planted before the verifier, and a subdir the host
    // may not empty (files of another id of the sandbox, read-only).
    env.task(
        "c-planted-reward",
        "",
        "#!/bin/bash\necho 1.0 > /logs/verifier/reward.txt\necho '{\"reward\": 1}' > /logs/verifier/reward.json\nmkdir -p /logs/verifier/sub\necho 1.0 > /logs/verifier/sub/reward.txt\nchown -R 4242:4242 /logs/verifier/sub\nchmod 0555 /logs/verifier/sub\nexit 0\n",
        "#!/bin/bash\nleft=$(ls -A /logs/verifier)\n[[ $left == test-stdout.txt ]] || { echo \"left: $left\"; exit 1; }\necho 0.5 > /logs/verifier/reward.txt\n",
    );
    // (d) The records overwritten, unmounted, removed, renamed.
    env.task(
        "d-records",
        "",
        r#"#!/bin/bash
forged='{"reward": 1.0, "status": "ok", "forged": true}'
for f in result.json sandbox.json; do
  echo "$forged" > /logs/$f
  umount /logs/$f
  umount -l /logs/$f
  rm -f /logs/$f
  mv /logs/$f /logs/$f.old
  echo "$forged" > /logs/$f
done
exit 0
"#,
        verifier,
    );
    // (e) An agent of its own user, left running: it must not reach the
    // verifier's dir at all.
    env.task(
        "e-other-user",
        "[agent]\nuser = \"user\"\n",
        "#!/bin/bash\n( while :; do rm -f /logs/verifier/reward.txt; echo 1.0 > /logs/verifier/reward.txt; mv /logs/verifier /logs/mine; sleep 0.02; done ) </dev/null >/dev/null 2>&1 &\nsleep 0.1\n",
        "#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\nsleep 0.5\n",
    );
    let outside_before = harness::snapshot(env.dir.path())
        .into_iter()
        .filter(|(p, _)| !p.starts_with("out"))
        .collect::<std::collections::BTreeMap<_, _>>();
    let tasks = env.path("tasks").display().to_string();
    let out = env.eval(&["--job", "h", "--jobs", "3", &tasks]).output();
    out.success();

    let outside_after = harness::snapshot(env.dir.path())
        .into_iter()
        .filter(|(p, _)| !p.starts_with("out"))
        .collect::<std::collections::BTreeMap<_, _>>();
    assert_eq!(
        harness::snapshot_diff(&outside_before, &outside_after),
        "",
        "files outside the job changed (the decoy is {d})"
    );
    let job = env.out().join("h");
    assert_eq!(mode_of(&env.out()), 0o700, "--out made by eval");
    assert_eq!(mode_of(&job), 0o700, "the job dir");
    let rollouts = [
        "a-symlinks__1",
        "b-lingering__1",
        "c-planted-reward__1",
        "d-records__1",
        "e-other-user__1",
    ];
    let mut top: Vec<String> = std::fs::read_dir(&job)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    let mut want: Vec<String> = [".lock", "job.json", "summary.json"]
        .iter()
        .chain(rollouts.iter())
        .map(|s| (*s).to_string())
        .collect();
    want.sort();
    assert_eq!(top, want, "what the job dir holds");
    for rollout in rollouts {
        let r = env.result("h", rollout);
        assert_eq!(outcome(&r), ok(0.5), "{rollout}: {r:#}\n{}", out.stderr);
        assert_eq!(r["reward_source"], "reward.txt", "{rollout}: {r:#}");
        let dir = job.join(rollout);
        assert_eq!(mode_of(&dir) & 0o022, 0, "{rollout} is writable by others");
        for sub in ["agent", "verifier", "artifacts"] {
            let p = dir.join(sub);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                assert_eq!(
                    mode_of(&p) & 0o002,
                    0,
                    "{rollout}/{sub} is writable by anyone"
                );
            }
        }
        let ev = env.json(&format!("h/{rollout}/sandbox.json"));
        assert!(
            ev["name"].as_str().is_some_and(|n| n.starts_with("eval-")),
            "{rollout}: {ev}"
        );
        assert!(ev["stopped"].is_object(), "{rollout}: {ev}");
        let tmp: Vec<_> = tree(&dir)
            .into_iter()
            .filter(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                n.starts_with(".verifier.left-") || n.contains(".tmp-")
            })
            .collect();
        assert!(tmp.is_empty(), "{rollout}: left behind {tmp:?}");
    }
    // Where nothing moved it, the verifier's output is in verifier/. (The
    // lingering planter may move the fresh dir or unlink the file in it:
    // the host's writes then go to that file still, never through its
    // symlinks.)
    for rollout in ["a-symlinks__1", "d-records__1"] {
        let p = job.join(rollout).join("verifier/test-stdout.txt");
        assert_eq!(
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
            "verifier-ran\n"
        );
    }
    let notes = |rollout: &str| -> Vec<String> {
        env.result("h", rollout)["notes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .filter(|n| !is_limit_note(n))
                    .collect()
            })
            .unwrap_or_default()
    };
    // verifier/ is read-only to the agent (a guarded bind): nothing was
    // planted there to remove.
    for rollout in ["a-symlinks__1", "c-planted-reward__1"] {
        assert!(notes(rollout).is_empty(), "{rollout}: {:?}", notes(rollout));
    }
    assert!(
        notes("e-other-user__1").is_empty(),
        "{:?}",
        notes("e-other-user__1")
    );
    // The agent's logs dirs are its writable layer's, mount points that it
    // cannot replace with a symlink: the copy out is a directory.
    assert!(std::fs::symlink_metadata(job.join("a-symlinks__1/agent"))
        .is_ok_and(|m| m.file_type().is_dir()));
    let d = env.result("h", "d-records__1");
    assert!(d.get("forged").is_none(), "{d:#}");
    let ev = std::fs::read_to_string(job.join("d-records__1/sandbox.json")).expect("read");
    assert!(!ev.contains("forged"), "{ev}");
}

/// A root agent leaves a process that keeps writing reward files (and
/// ticks, to show it is alive) while the verifier runs: the reward is the
/// verifier's. The agent's sandbox shows /logs/verifier read-only to it;
/// the verifier's commands alone see it writable (a guarded bind).
#[test]
fn a_process_the_agent_leaves_cannot_rewrite_the_reward() {
    let env = Env::with_evalbase();
    env.task(
        "forger",
        "",
        "#!/bin/bash
         setsid bash -c 'while :; do echo 0.99 > /logs/verifier/reward.txt; echo 0.99 > /logs/verifier/reward.json; echo t >> /tmp/ticks; sleep 0.01; done' </dev/null >/dev/null 2>&1 &
         while ! test -s /tmp/ticks; do sleep 0.01; done
",
        "#!/bin/bash
         echo 0.25 > /logs/verifier/reward.txt
         before=$(wc -l < /tmp/ticks); sleep 1; after=$(wc -l < /tmp/ticks)
         [ \"$after\" -gt \"$before\" ] && echo agent-loop-alive
         cat /logs/verifier/reward.txt
",
    );
    let tasks = env.path("tasks").display().to_string();
    let out = env.eval(&["--job", "j", &tasks]).output();
    out.success();
    let r = env.result("j", "forger__1");
    let dir = env.out().join("j/forger__1");
    let log = std::fs::read_to_string(dir.join("verifier/test-stdout.txt")).unwrap_or_default();
    // The forger ran all along (else the test proves nothing).
    assert!(log.contains("agent-loop-alive"), "{log}\n{r:#}");
    assert_eq!(outcome(&r), ok(0.25), "{r:#}\n{log}\n{}", out.stderr);
    assert_eq!(r["reward_source"], "reward.txt", "{r:#}");
    assert!(!dir.join("verifier/reward.json").exists());
    assert!(r.get("ended_agent_processes").is_none(), "{r:#}");
}

/// As root in its sandbox, the agent finds /logs/verifier read-only and
/// cannot make it writable: no write, no remount (plain or bind), no
/// unmount, no rename; nor in a user and mount namespace of its own
/// (`--allow-userns`), where the mount is locked. The verifier still
/// writes its reward there.
#[test]
fn the_agent_sees_the_verifiers_dir_read_only_and_cannot_make_it_writable() {
    let env = Env::with_evalbase();
    let tries = r#"
try() { if "$@" >/dev/null 2>&1; then echo "ALLOWED: $*"; else echo "denied: $*"; fi; }
try sh -c 'echo 1 > /logs/verifier/reward.txt'
try mkdir /logs/verifier/sub
try mount -o remount,rw /logs/verifier
try mount -o remount,bind,rw /logs/verifier
try umount /logs/verifier
try umount -l /logs/verifier
try mv /logs/verifier /logs/moved
try rmdir /logs/verifier
try sh -c 'echo 1 > /logs/verifier/reward.txt'
"#;
    env.task(
        "remount",
        "",
        &format!(
            "#!/bin/bash
{{
{tries}
whoami 2>/dev/null || id -u
             try unshare -Urm sh -c 'mount -o remount,rw /logs/verifier && echo 1 > /logs/verifier/reward.txt'
             try unshare -Urm sh -c 'umount /logs/verifier && echo 1 > /logs/verifier/reward.txt'
             }} > /logs/agent/tries 2>&1
"
        ),
        "#!/bin/bash
echo 0.5 > /logs/verifier/reward.txt
",
    );
    let tasks = env.path("tasks").display().to_string();
    let out = env.eval(&["--job", "j", "--allow-userns", &tasks]).output();
    out.success();
    let r = env.result("j", "remount__1");
    let dir = env.out().join("j/remount__1");
    let tries = std::fs::read_to_string(dir.join("agent/tries")).expect("the agent's tries");
    assert!(!tries.contains("ALLOWED"), "{tries}");
    assert_eq!(tries.matches("denied:").count(), 11, "{tries}");
    assert_eq!(outcome(&r), ok(0.5), "{r:#}\n{tries}\n{}", out.stderr);
    assert!(!dir.join("verifier/sub").exists());
    assert!(!dir.join("moved").exists());
}

/// `--end-agent-processes`: what the agent left running is ended before
/// the verifier runs, and result.json says how many; without the flag it
/// runs on (an agent's service the verifier probes keeps working), and a
/// root agent's leftover reaches the verifier's `/logs/verifier` through
/// `/proc/PID/root` of the verifier's processes (SECURITY.md's limit).
#[test]
fn end_agent_processes_ends_what_the_agent_left_before_the_verifier() {
    let env = Env::with_evalbase();
    env.task(
        "leftover",
        "",
        "#!/bin/bash
         setsid bash -c 'echo $$ > /tmp/leftover.pid; while :; do sleep 0.05; done' </dev/null >/dev/null 2>&1 &
         ( sleep 1000 & ) 
         while ! test -s /tmp/leftover.pid; do sleep 0.01; done
",
        "#!/bin/bash
         p=$(cat /tmp/leftover.pid)
         if [ -d /proc/$p ]; then echo 0; else echo 1; fi > /logs/verifier/reward.txt
",
    );
    env.task(
        "via-proc-root",
        "",
        "#!/bin/bash\n\
         setsid bash -c 'while :; do for p in /proc/[0-9]*; do echo 0.9 > $p/root/logs/verifier/reward.txt; done 2>/dev/null; done' </dev/null >/dev/null 2>&1 &\n\
         sleep 0.2\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nsleep 1\n",
    );
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "kept", &tasks]).output().success();
    let forged = env.result("kept", "via-proc-root__1");
    assert_ne!(outcome(&forged), ok(1.0), "{forged:#}");
    let kept = env.result("kept", "leftover__1");
    assert_eq!(outcome(&kept), ok(0.0), "{kept:#}");
    assert!(kept.get("ended_agent_processes").is_none(), "{kept:#}");
    env.eval(&["--job", "ended", "--end-agent-processes", &tasks])
        .output()
        .success();
    let closed = env.result("ended", "via-proc-root__1");
    assert_eq!(outcome(&closed), ok(1.0), "{closed:#}");
    let ended = env.result("ended", "leftover__1");
    assert_eq!(outcome(&ended), ok(1.0), "{ended:#}");
    // The loop, its sleep, and the sleep 1000 (at least three).
    let n = ended["ended_agent_processes"].as_u64().expect("recorded");
    assert!(n >= 3, "{ended:#}");
}

/// A task whose solve.sh (or test.sh) is a symlink to a file of the
/// caller's outside the task (the audit read any file the caller could)
/// uploads nothing of it: the rollout fails saying why, and the file's
/// contents reach neither the sandbox nor the job's files.
#[test]
fn a_task_script_symlinked_out_of_the_task_reads_nothing() {
    let env = Env::with_evalbase();
    let secret = unique("caller-file");
    let decoy = env.path("decoy");
    std::fs::write(
        &decoy,
        format!("#!/bin/sh\necho {secret} > /logs/agent/leak\n"),
    )
    .expect("decoy");
    let reward = "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n";
    for name in ["solve-link", "test-link"] {
        let t = env.task(name, "", "#!/bin/sh\ntrue\n", reward);
        let script = if name == "solve-link" {
            "solution/solve.sh"
        } else {
            "tests/test.sh"
        };
        std::fs::remove_file(t.join(script)).expect("rm");
        std::os::unix::fs::symlink(&decoy, t.join(script)).expect("symlink");
    }
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "j", &tasks]).output();
    for name in ["solve-link", "test-link"] {
        let r = env.result("j", &format!("{name}__1"));
        assert_ne!(r["status"], "ok", "{r:#}");
        assert!(
            r.to_string().contains("leads out of the task's directory"),
            "{r:#}"
        );
    }
    // Nothing of the job's holds the decoy's contents.
    for (path, md) in harness::entries_below(&env.out()) {
        let text = if md.is_file() {
            std::fs::read(&path).unwrap_or_default()
        } else {
            Vec::new()
        };
        assert!(
            !String::from_utf8_lossy(&text).contains(&secret),
            "the caller's file reached {}",
            path.display()
        );
    }
}

/// A task's `docker_image` naming a SIF outside the dir given to eval
/// (`../../private/private.sif`) is refused up front, exit 125, naming the
/// task, the path and `--allow-image-dir`, and nothing runs; on main eval
/// imported any SIF the caller can read and its agent read it. Allowed
/// with `--allow-image-dir DIR`, the same task runs on that image.
#[test]
fn a_tasks_sif_outside_the_suite_is_refused_unless_allowed() {
    let env = Env::with_evalbase();
    let secret = unique("private-image");
    let base = env.path("private-rootfs");
    copy_rootfs(&base);
    std::fs::write(base.join("secret"), &secret).expect("write");
    let other = Store::new("sifbox-eval-private.");
    other
        .import(&base, "priv")
        .timeout(EVAL_TIMEOUT)
        .output()
        .success();
    let private = env.path("private");
    std::fs::create_dir_all(&private).expect("mkdir");
    let sif = private.join("private.sif");
    other
        .cmd(["image", "export", "priv", sif.to_str().expect("utf-8")])
        .timeout(EVAL_TIMEOUT)
        .output()
        .success();
    env.task(
        "sif-outside",
        "[environment]\ndocker_image = \"../../private/private.sif\"\n",
        "#!/bin/sh\ncat /secret > /logs/agent/seen\n",
        "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    let images = || {
        let out = env.cmd(&["image", "ls", "--json"]).output();
        let v: Value = serde_json::from_str(&out.success().stdout).expect("json");
        v["images"].as_array().map_or(0, Vec::len)
    };
    let before = images();
    let out = env.eval(&["--job", "j", &tasks]).output();
    out.code_is(125);
    for want in ["sif-outside", "private.sif", "--allow-image-dir"] {
        assert!(out.stderr.contains(want), "{want}: {}", out.stderr);
    }
    assert!(!env.out().join("j").exists(), "a refused job left its dir");
    assert_eq!(images(), before, "the store imported it");
    // Allowed: the same task runs on the private image.
    let allow = private.display().to_string();
    env.eval(&["--job", "k", "--allow-image-dir", &allow, &tasks])
        .output()
        .success();
    let r = env.result("k", "sif-outside__1");
    assert_eq!(r["status"], "ok", "{r:#}");
    let seen = std::fs::read_to_string(env.out().join("k/sif-outside__1/agent/seen"))
        .expect("the agent's file");
    assert_eq!(seen, secret);
}

/// An agent's /logs/agent and /logs/artifacts live in its writable layer:
/// one of `storage_mb = 64` that writes 200 MiB there is cut at the
/// layer's size, and the job dir holds at most that (on main, /logs was
/// the host's dir and took all of it); one that makes more entries than
/// the copy-out's bound (20,000) gets that many in the job dir, and
/// result.json's `logs` says what was cut.
#[test]
fn an_agents_logs_are_bounded_by_its_storage_and_the_copy_out() {
    let env = Env::with_evalbase();
    let reward = "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n";
    env.task(
        "logs-big",
        "[environment]\nstorage_mb = 64\n",
        "#!/bin/sh\nhead -c 209715200 /dev/zero > /logs/agent/big\necho x > /logs/artifacts/kept || true\n",
        reward,
    );
    env.task(
        "logs-many",
        "",
        "#!/bin/sh\ncd /logs/agent && seq 1 20050 | xargs touch\n",
        reward,
    );
    let tasks = env.path("tasks").display().to_string();
    env.eval(&["--job", "j", &tasks]).output();
    let sizes = |rollout: &str| -> (u64, usize) {
        let mut bytes = 0;
        let mut n = 0;
        for sub in ["agent", "artifacts"] {
            let d = env.out().join("j").join(rollout).join(sub);
            for (_, md) in harness::entries_below(&d) {
                n += 1;
                if md.is_file() {
                    bytes += md.len();
                }
            }
        }
        (bytes, n)
    };
    let r = env.result("j", "logs-big__1");
    let (bytes, _) = sizes("logs-big__1");
    assert!(bytes <= 64 << 20, "the job dir holds {bytes} bytes: {r:#}");
    assert!(bytes > 0, "nothing was copied out: {r:#}");
    let logs = &r["logs"];
    assert!(logs["bytes"].as_u64().expect("bytes") <= 64 << 20, "{r:#}");
    let r = env.result("j", "logs-many__1");
    let logs = &r["logs"];
    assert_eq!(logs["truncated"], true, "{r:#}");
    assert_eq!(logs["files"], 20_000, "{r:#}");
    assert!(
        logs["cut"].as_str().expect("cut").contains("entries"),
        "{r:#}"
    );
    let (_, n) = sizes("logs-many__1");
    assert!(n <= 20_000, "the job dir holds {n} entries");
    assert!(n > 19_000, "the job dir holds only {n} entries");
}

/// A task's `${VAR}` sees only what the caller passes (`--pass-env`): the
/// audit's suite took API keys from the caller's environment by naming
/// them. Unpassed, `${VAR:-default}` gives the default (with a warning
/// that the caller has VAR); passed, the value arrives, and result.json
/// names the variable, never its value.
#[test]
fn a_task_sees_only_the_environment_the_caller_passes() {
    let env = Env::with_evalbase();
    let secret = unique("caller-secret");
    env.task(
        "greedy",
        "[environment]\nenv = { KEY = \"${EVAL_TEST_API_KEY:-none}\" }\n",
        "#!/bin/sh\necho \"$KEY\" > /logs/agent/key\n",
        "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    let key = |job: &str| {
        std::fs::read_to_string(env.out().join(job).join("greedy__1/agent/key")).expect("key")
    };
    let out = env
        .eval(&["--job", "kept", &tasks])
        .env("EVAL_TEST_API_KEY", &secret)
        .output();
    out.success().stderr_has("--pass-env EVAL_TEST_API_KEY");
    assert_eq!(key("kept"), "none\n", "the task read the caller's variable");
    env.eval(&["--job", "passed", "--pass-env", "EVAL_TEST_API_KEY", &tasks])
        .env("EVAL_TEST_API_KEY", &secret)
        .output()
        .success();
    assert_eq!(key("passed"), format!("{secret}\n"));
    let r = env.result("passed", "greedy__1");
    let text = r.to_string();
    assert!(text.contains("EVAL_TEST_API_KEY"), "{r:#}");
    assert!(
        !text.contains(&secret),
        "the value is in result.json: {r:#}"
    );
    env.eval(&["--job", "bad", "--pass-env", "A=1", &tasks])
        .output()
        .sifbox_error()
        .stderr_has("--pass-env A=1");
}

/// User namespaces inside are denied by default, and only the caller
/// grants them: per task (`--allow-userns-task NAME`) or per job
/// (`--allow-userns`). A task's own `[metadata.sifbox] allow_userns = true`
/// is a request, noted in its result.json, that grants nothing (it once
/// did: a suite lifted its own confinement).
#[test]
fn user_namespaces_are_granted_by_the_caller_not_the_task() {
    let env = Env::with_evalbase();
    // The agent records whether it could make a user namespace; the
    // verifier turns that into the reward.
    let solve = "#!/bin/sh\nif unshare -U true 2>/dev/null; then echo yes > /tmp/userns; else echo no > /tmp/userns; fi\n";
    let test = "#!/bin/sh\nif [ \"$(cat /tmp/userns)\" = yes ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n";
    env.task("plain", "", solve, test);
    env.task(
        "opted-in",
        "[metadata.sifbox]\nallow_userns = true\n",
        solve,
        test,
    );
    let tasks = env.path("tasks").display().to_string();
    let asks = |r: &serde_json::Value, granted: &str| {
        r["notes"].as_array().into_iter().flatten().any(|n| {
            n.as_str().is_some_and(|n| {
                n.contains("asks for nested user namespaces") && n.contains(granted)
            })
        })
    };
    env.eval(&["--job", "none", &tasks]).output().success();
    assert_eq!(outcome(&env.result("none", "plain__1")), ok(0.0));
    let r = env.result("none", "opted-in__1");
    assert_eq!(outcome(&r), ok(0.0), "the task granted itself namespaces");
    assert!(asks(&r, "not granted"), "{r:#}");
    assert!(!asks(&env.result("none", "plain__1"), "granted"));
    env.eval(&["--job", "one", "--allow-userns-task", "opted-in", &tasks])
        .output()
        .success();
    assert_eq!(outcome(&env.result("one", "plain__1")), ok(0.0));
    let r = env.result("one", "opted-in__1");
    assert_eq!(outcome(&r), ok(1.0));
    assert!(asks(&r, "granted by the caller"), "{r:#}");
    env.eval(&["--job", "all", "--allow-userns", &tasks])
        .output()
        .success();
    assert_eq!(outcome(&env.result("all", "plain__1")), ok(1.0));
    // A name that is no task of the suite is bad input, before anything runs.
    env.eval(&["--job", "typo", "--allow-userns-task", "opted-inn", &tasks])
        .output()
        .sifbox_error()
        .stderr_has("--allow-userns-task opted-inn");
    // A wrong type is bad input, before anything runs.
    env.task(
        "bad",
        "[metadata.sifbox]\nallow_userns = \"yes\"\n",
        solve,
        test,
    );
    env.eval(&["--job", "bad", &tasks])
        .output()
        .sifbox_error()
        .stderr_has("[metadata.sifbox]");
}

// ===========================================================================
// Task suites as Harbor 0.26 and BenchFlow 0.7.11 write them (issue 16):
// the corpus of crates/sifbox/tests/e2e/tasks, on busybox (no bash).
// ===========================================================================

/// The corpus: `$SIFBOX_TEST_CORPUS`, else the repository's.
fn corpus() -> PathBuf {
    match std::env::var_os("SIFBOX_TEST_CORPUS").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/tasks"),
    }
}

/// Every `.sh` below `dir`, made 0644: the scripts must run without being
/// executable in the task (Harbor makes them so).
fn not_executable(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            not_executable(&p);
        } else if p.extension().is_some_and(|x| x == "sh") {
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .expect("chmod");
        }
    }
}

/// Harbor's separate verifier (`[verifier] environment_mode = "separate"`):
/// a fresh sandbox of its own image (tests/Dockerfile, which holds the
/// tests; `[verifier.environment] docker_image`; else the task's image
/// with the tests uploaded), started after the agent's stopped, given
/// /logs/artifacts (read-only) and a fresh /logs/verifier and nothing else
/// of the agent's; both sandboxes in the result. A verifier image that
/// cannot be built is `build_failed`, before the agent runs.
#[test]
fn separate_verifier_runs_in_its_own_sandbox_and_image() {
    let env = Env::new();
    let base = env.path("busybox-rootfs");
    copy_rootfs(&base);
    env.import(&base, "busybox");
    // A grader image of the store, its tests in it.
    let grader = env.path("grader-rootfs");
    copy_rootfs(&grader);
    std::fs::write(grader.join("etc/image-of"), "grader\n").expect("write");
    std::fs::create_dir_all(grader.join("tests")).expect("mkdir");
    std::fs::write(
        grader.join("tests/test.sh"),
        "#!/bin/sh\n[ \"$(cat /etc/image-of)\" = grader ] && [ \"$(cat /logs/artifacts/result)\" = handed ] && [ ! -e /logs/agent/secret ] && echo 1 > /logs/verifier/reward.txt\n",
    )
    .expect("write");
    env.import(&grader, "grader");
    let tasks = env.path("tasks");
    std::fs::create_dir_all(&tasks).expect("mkdir");
    for t in [
        "separate-verifier",
        "separate-verifier-task-image",
        "separate-verifier-build-fails",
    ] {
        run_tool(
            Command::new("cp")
                .arg("-a")
                .arg(corpus().join(t))
                .arg(&tasks),
        );
    }
    not_executable(&tasks);
    // [verifier.environment] (BenchFlow's spelling), no test.sh here.
    env.write(
        "tasks/separate-verifier-store-image/task.toml",
        "[environment]\ndocker_image = \"busybox\"\n[verifier.sandbox]\nimage = \"grader\"\n",
    );
    env.write("tasks/separate-verifier-store-image/instruction.md", "x\n");
    env.write(
        "tasks/separate-verifier-store-image/solution/solve.sh",
        "#!/bin/sh\necho handed > /logs/artifacts/result\necho secret > /logs/agent/secret\n",
    );
    std::fs::create_dir_all(tasks.join("separate-verifier-store-image/tests")).expect("mkdir");
    let t = tasks.display().to_string();
    let out = env
        .eval(&["--job", "j", "--jobs", "2", &t])
        .timeout(Duration::from_secs(300))
        .output();
    out.success();
    assert!(
        !out.stderr.contains("not honoured"),
        "separate verifiers are honoured: {}",
        out.stderr
    );
    let r = |t: &str| env.result("j", &format!("{t}__1"));

    let t = r("separate-verifier");
    let stdout = std::fs::read_to_string(
        env.out()
            .join("j/separate-verifier__1/verifier/test-stdout.txt"),
    )
    .unwrap_or_default();
    assert_eq!(outcome(&t), ok(1.0), "{t:#}\n{stdout}");
    let vs = &t["verifier_sandbox"];
    assert_eq!(
        vs["image"]["reference"], "eval/separate-verifier-verifier",
        "{t:#}"
    );
    assert_ne!(vs["image"]["digest"], t["image"]["digest"], "{t:#}");
    assert_ne!(vs["sandbox"], t["sandbox"], "{t:#}");
    assert_eq!(
        vs["handed_over"],
        serde_json::json!(["/logs/artifacts"]),
        "{t:#}"
    );
    assert_eq!(vs["build_log"], "verifier-build.log", "{t:#}");
    assert!(
        env.out()
            .join("j/separate-verifier__1/verifier-build.log")
            .is_file()
            && env
                .out()
                .join("j/builds/separate-verifier.verifier.log")
                .is_file(),
        "{t:#}"
    );
    // Both sandboxes' parts are in the timings.
    let timing = |k: &str| t["timings_ms"][k].as_u64().expect("ms");
    for (part, of_verifier) in [
        ("build", "build_ms"),
        ("start", "start_ms"),
        ("stop", "stop_ms"),
    ] {
        assert!(
            timing(part) >= vs[of_verifier].as_u64().expect("ms"),
            "{part}: {t:#}"
        );
    }
    assert!(vs["start_ms"].as_u64().expect("ms") > 0, "{t:#}");
    // The agent could plant no reward: verifier/ is read-only to it.
    assert!(
        !notes(&t)
            .iter()
            .any(|n| n.contains("a reward file was there")),
        "{t:#}"
    );
    // The agent's record stays: its logs, its artifacts (the verifier
    // could not write there).
    let job = env.out().join("j/separate-verifier__1");
    assert_eq!(
        std::fs::read_to_string(job.join("agent/secret")).expect("secret"),
        "secret\n"
    );
    assert!(!job.join("artifacts/mine").exists());

    let t = r("separate-verifier-task-image");
    let stdout = std::fs::read_to_string(
        env.out()
            .join("j/separate-verifier-task-image__1/verifier/test-stdout.txt"),
    )
    .unwrap_or_default();
    assert_eq!(outcome(&t), ok(1.0), "{t:#}\n{stdout}");
    assert_eq!(
        t["verifier_sandbox"]["image"]["digest"], t["image"]["digest"],
        "the task's image: {t:#}"
    );
    assert_ne!(t["verifier_sandbox"]["sandbox"], t["sandbox"], "{t:#}");

    let t = r("separate-verifier-store-image");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(
        t["verifier_sandbox"]["image"]["reference"], "grader",
        "{t:#}"
    );

    let t = r("separate-verifier-build-fails");
    assert_eq!(outcome(&t), failed("build_failed", None), "{t:#}");
    let e = t["error"].as_str().expect("error");
    assert!(e.contains("the verifier's image"), "{e}");
    assert!(
        t["agent_run"].is_null() && t["verifier_run"].is_null(),
        "{t:#}"
    );
    assert!(
        std::fs::read_to_string(
            env.out()
                .join("j/separate-verifier-build-fails__1/verifier-build.log")
        )
        .expect("log")
        .contains("the grader cannot be built"),
        "{t:#}"
    );
}

/// Harbor's multi-step tasks (`[[steps]]`, `steps/NAME/`): the steps run in
/// order in one sandbox, each with its instruction, solution, tests (merged
/// over tests/) and verifier env; each step's logs are its own and out of
/// the later steps' sight; result.json has each step's reward and the
/// rollout's by the strategy (mean by default, or final); a step below its
/// `min_reward` ends the rollout.
#[test]
fn multi_step_tasks_run_their_steps_and_combine_their_rewards() {
    let env = Env::new();
    let base = env.path("busybox-rootfs");
    copy_rootfs(&base);
    env.import(&base, "busybox");
    let tasks = env.path("tasks");
    std::fs::create_dir_all(&tasks).expect("mkdir");
    for t in ["multi-step", "multi-step-min-reward"] {
        run_tool(
            Command::new("cp")
                .arg("-a")
                .arg(corpus().join(t))
                .arg(&tasks),
        );
    }
    not_executable(&tasks);
    let t = tasks.display().to_string();
    let out = env
        .eval(&["--job", "j", &t])
        .timeout(Duration::from_secs(300))
        .output();
    out.success();
    assert!(!out.stderr.contains("not honoured"), "{}", out.stderr);
    let dir = env.out().join("j/multi-step__1");
    let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).unwrap_or_default();

    let t = env.result("j", "multi-step__1");
    let steps: Vec<(String, Option<f64>)> = t["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["step"].as_str().expect("name").to_string(),
                s["reward"].as_f64(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            ("a".to_string(), Some(1.0)),
            ("b".to_string(), Some(1.0)),
            ("c".to_string(), Some(0.25))
        ],
        "{t:#}\n{}",
        read("steps/b/verifier/test-stdout.txt")
    );
    // Mean: each key over the steps, a missing one counting 0.
    assert_eq!(outcome(&t), ok(0.75), "{t:#}");
    assert_eq!(t["reward_source"], "steps (mean)", "{t:#}");
    assert!(
        (t["rewards"]["b_only"].as_f64().expect("b_only") - 1.0 / 3.0).abs() < 1e-9,
        "{t:#}"
    );
    assert_eq!(t["steps"][1]["rewards"]["b_only"], 1, "{t:#}");
    assert!(t["steps"][0]["agent_run"]["duration_ms"].is_u64(), "{t:#}");
    // Each step's outputs (the agent's user's), in steps/NAME/ after the
    // sandbox stopped.
    assert_eq!(read("steps/a/agent/a-log"), "log\n");
    assert_eq!(read("steps/a/verifier/reward.txt"), "1\n");
    assert_eq!(read("steps/c/verifier/reward.txt"), "0.25\n");
    assert!(dir.join("steps/b/agent/oracle.txt").is_file());
    assert_eq!(t["steps"][0]["agent_run"]["user"], "1000:1000", "{t:#}");
    assert!(!env.out().join("j/.steps/multi-step__1").exists());

    let t = env.result("j", "multi-step-min-reward__1");
    let names: Vec<&str> = t["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["step"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["first", "gate"], "{t:#}");
    // Final: the last step run's reward.
    assert_eq!(outcome(&t), ok(0.25), "{t:#}");
    assert_eq!(t["reward_source"], "steps (final)", "{t:#}");
    assert!(
        notes(&t).iter().any(|n| n.contains(
            "step gate: reward = 0.25 is below min_reward 0.5: the remaining steps were not run"
        )),
        "{t:#}"
    );
    assert!(!env
        .out()
        .join("j/multi-step-min-reward__1/steps/never")
        .exists());
}

#[test]
fn task_corpus_gives_each_field_its_reward_and_class() {
    let env = Env::new();
    let base = env.path("busybox-rootfs");
    copy_rootfs(&base);
    assert!(
        !base.join("bin/bash").exists() && !base.join("usr/bin/bash").exists(),
        "the test rootfs must have no bash"
    );
    env.import(&base, "busybox");
    // The corpus, copied: its scripts 0644, and a SIF beside sif-image's
    // task.toml, exported from another store (so that this one has it only
    // by importing the file), plus the same SIF named by an absolute path.
    let tasks = env.path("corpus");
    run_tool(Command::new("cp").arg("-a").arg(corpus()).arg(&tasks));
    not_executable(&tasks);
    let other = Store::new("sifbox-eval-sif.");
    other
        .import(&base, "bb")
        .timeout(EVAL_TIMEOUT)
        .output()
        .success();
    let sif = tasks.join("sif-image/image/busybox.sif");
    std::fs::create_dir_all(sif.parent().expect("parent")).expect("mkdir");
    other
        .cmd(["image", "export", "bb", sif.to_str().expect("utf-8")])
        .timeout(EVAL_TIMEOUT)
        .output()
        .success();
    run_tool(
        Command::new("cp")
            .arg("-a")
            .arg(tasks.join("sif-image"))
            .arg(tasks.join("sif-abs")),
    );
    std::fs::write(
        tasks.join("sif-abs/task.toml"),
        format!(
            "[environment]\ndocker_image = {:?}\n",
            sif.display().to_string()
        ),
    )
    .expect("write");
    std::fs::remove_dir_all(tasks.join("sif-abs/image")).expect("rm");

    // The suite given twice, and one of its tasks again: each task once.
    let t = tasks.display().to_string();
    let again = tasks.join("sh-shebang").display().to_string();
    let out = env
        .eval(&["--job", "j", "--jobs", "2", &t, &t, &again])
        .timeout(Duration::from_secs(300))
        .output();
    out.success();
    let r = |t: &str| env.result("j", &format!("{t}__1"));
    let unsupported = |t: &str, field: &str| {
        let res = r(t);
        assert_eq!(outcome(&res), failed("unsupported", None), "{t}: {res:#}");
        let e = res["error"].as_str().expect("error");
        assert!(e.contains(field), "{t}: {e}");
        assert!(
            res["agent_run"].is_null() && res["verifier_run"].is_null(),
            "{res:#}"
        );
        assert!(
            res["image"]["digest"].is_null(),
            "nothing was built: {res:#}"
        );
        // A task.toml's field is said before anything runs, too.
        assert!(
            field.starts_with("--agent")
                || (out.stderr.contains(&format!("task {t}: ")) && out.stderr.contains(field)),
            "{t}: {}",
            out.stderr
        );
    };
    let read = |rel: &str| {
        std::fs::read_to_string(env.out().join("j").join(rel))
            .unwrap_or_else(|e| panic!("reading {rel}: {e}"))
    };

    // Scripts run by their shebang, on an image without bash.
    assert_eq!(outcome(&r("sh-shebang")), ok(1.0), "{:#}", r("sh-shebang"));
    assert_eq!(
        outcome(&r("built-from-busybox")),
        ok(1.0),
        "{:#}",
        r("built-from-busybox")
    );
    assert_eq!(outcome(&r("deep-task")), ok(1.0), "found at any depth");
    // Users as numbers.
    let t = r("numeric-user");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(t["agent_run"]["user"], "1000", "{t:#}");
    assert_eq!(read("numeric-user__1/agent/who"), "1000\n");
    // reward.json of any keys; numbers only.
    let t = r("reward-keys");
    assert_eq!(outcome(&t), ("ok".into(), None, None), "{t:#}");
    assert_eq!(t["rewards"]["accuracy"], 0.5, "{t:#}");
    assert_eq!(t["rewards"]["passed"], 3, "{t:#}");
    let t = r("reward-not-numbers");
    assert_eq!(outcome(&t), failed("verifier_failed", None), "{t:#}");
    assert!(
        t["error"].as_str().expect("error").contains("\"detail\""),
        "{t:#}"
    );
    // BenchFlow's spellings: [sandbox], image, [oracle] (and oracle/,
    // verifier/), the env shorthand, [reward], the legacy storage size.
    let t = r("benchflow-spellings");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(t["limits"]["storage_mb"], 64, "{t:#}");
    assert_eq!(t["limits"]["source"]["storage_mb"], "task", "{t:#}");
    // Setup commands: in order, before the agent, with env, cwd and user.
    let t = r("setup-commands");
    assert_eq!(
        outcome(&t),
        ok(1.0),
        "{t:#}\n{}",
        read("setup-commands__1/setup.txt")
    );
    let t = r("setup-fails");
    assert_eq!(outcome(&t), failed("setup_failed", None), "{t:#}");
    let e = t["error"].as_str().expect("error");
    assert!(
        e.contains("setup_commands[0]")
            && e.contains("exited with code 3")
            && e.contains("seeding failed"),
        "{e}"
    );
    assert!(t["agent_run"].is_null(), "the agent did not run: {t:#}");
    // What cannot be honoured: its own class, the field named, the other
    // tasks run.
    unsupported("unsupported-windows", "os = \"windows\"");
    unsupported("unsupported-judge", "type = \"llm-judge\"");
    unsupported("unsupported-mcp", "mcp_servers");
    unsupported("unsupported-allowlist", "network_mode = \"allowlist\"");
    unsupported("unsupported-denylist", "network_mode = \"denylist\"");
    unsupported("no-solution", "--agent oracle");
    // Unknown keys: a warning with a did-you-mean, here and in the result.
    let t = r("misspelt-keys");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    for hint in ["did you mean `timeout_sec`?", "did you mean `verifier`?"] {
        assert!(out.stderr.contains(hint), "{hint}: {}", out.stderr);
        assert!(notes(&t).iter().any(|n| n.contains(hint)), "{hint}: {t:#}");
    }
    // The healthcheck: failures within start_period_sec do not count,
    // checks come start_interval_sec apart there.
    let t = r("health-start-period");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert!(
        t["timings_ms"]["start"].as_u64().expect("ms") < 2500,
        "{t:#}"
    );
    assert_eq!(outcome(&r("health-no-grace")), failed("start_failed", None));
    // docker_image naming a .sif file, relative and absolute.
    for task in ["sif-image", "sif-abs"] {
        let t = r(task);
        assert_eq!(outcome(&t), ok(1.0), "{task}: {t:#}");
        assert!(
            t["image"]["reference"]
                .as_str()
                .expect("ref")
                .ends_with("busybox.sif"),
            "{t:#}"
        );
    }
    // BenchFlow's task.md: its front matter (BenchFlow's shorthands and
    // spellings) and its `## prompt` alone as /instruction.md; it wins
    // over the task.toml beside it, whose image does not exist.
    let t = r("task-md");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(t["limits"]["storage_mb"], 64, "{t:#}");
    assert_eq!(t["agent_run"]["user"], "1000", "{t:#}");
    // A compose file of one service, the task's own: its environment (the
    // task.toml's env winning), working_dir and user reach the agent and
    // the verifier, its command runs detached; its ports are noted and
    // ignored.
    let t = r("compose-single");
    assert_eq!(outcome(&t), ok(1.0), "{t:#}");
    assert_eq!(t["agent_run"]["user"], "1000:1000", "{t:#}");
    assert!(
        notes(&t)
            .iter()
            .any(|n| n.contains("docker-compose.yaml") && n.contains("ports")),
        "{t:#}"
    );
    assert!(
        notes(&t).iter().any(|n| n.contains("runs detached")),
        "{t:#}"
    );
    // Two services: not one sandbox.
    unsupported("compose-multi", "multi-service compose");

    // Separate verifiers: in their own image (tests/Dockerfile) or a fresh
    // sandbox of the task's, given the artifacts and nothing else of the
    // agent's; an image that cannot be built is build_failed.
    for t in ["separate-verifier", "separate-verifier-task-image"] {
        let res = r(t);
        assert_eq!(outcome(&res), ok(1.0), "{t}: {res:#}");
        assert_ne!(
            res["verifier_sandbox"]["sandbox"], res["sandbox"],
            "{res:#}"
        );
    }
    let t = r("separate-verifier-build-fails");
    assert_eq!(outcome(&t), failed("build_failed", None), "{t:#}");
    // Multi-step tasks: the steps' mean, or the last step run's.
    assert_eq!(outcome(&r("multi-step")), ok(0.75), "{:#}", r("multi-step"));
    assert_eq!(
        outcome(&r("multi-step-min-reward")),
        ok(0.25),
        "{:#}",
        r("multi-step-min-reward")
    );

    let s = env.json("j/summary.json");
    assert_eq!(s["rollouts"], 28, "each task once: {s:#}");
    assert_eq!(s["infra_errors"], 0, "{s:#}");
    assert_eq!(s["failures"]["unsupported"], 7, "{s:#}");
    let keys = s["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["task"] == "reward-keys")
        .expect("reward-keys")
        .clone();
    assert_eq!(keys["mean_rewards"]["accuracy"], 0.5, "{keys:#}");
    assert_eq!(keys["mean_rewards"]["passed"], 3.0, "{keys:#}");

    // The nop agent on the no-solution task runs it: the oracle's want of
    // a solution is the oracle's alone.
    let nos = tasks.join("no-solution").display().to_string();
    env.eval(&["--job", "nop", "--agent", "nop", &nos])
        .output()
        .success();
    assert_eq!(outcome(&env.result("nop", "no-solution__1")), ok(1.0));
    // The nop agent on the task.md task: its verifier finds nothing done.
    let md = tasks.join("task-md").display().to_string();
    env.eval(&["--job", "nop-md", "--agent", "nop", &md])
        .output()
        .success();
    assert_eq!(outcome(&env.result("nop-md", "task-md__1")), ok(0.0));
}

#[test]
fn a_malformed_task_md_refuses_the_whole_job() {
    let env = Env::new();
    let good = env.good_task();
    let cases = [
        (
            "---\nagent:\n  timeout_sec: [1,\n---\n## prompt\nx\n",
            "bad/task.md:",
            "not valid YAML",
        ),
        (
            "---\nimage: busybox\nagent:\n  user: x\n  timeout_sec: soon\n---\nx\n",
            "bad/task.md:5",
            "agent.timeout_sec",
        ),
        ("---\nimage: busybox\n", "bad/task.md:1", "closing ---"),
        ("no front matter\n", "bad/task.md:1", "must start"),
        ("---\nprofile: nope\n---\nx\n", "bad/task.md:2", "profile"),
    ];
    for (md, at, needle) in cases {
        env.write("tasks/bad/task.md", md);
        env.write("tasks/bad/tests/test.sh", "#!/bin/sh\n");
        let out = env.eval_all();
        out.sifbox_error().stderr_has(needle).stderr_has(at);
        assert!(!env.out().exists(), "{md:?} left {}", env.out().display());
    }
    let _ = good;
}

#[test]
fn a_malformed_task_toml_refuses_the_whole_job() {
    let env = Env::new();
    let good = env.good_task();
    let cases = [
        ("[agent]\nuser = 1.5\n", "expected a user"),
        ("[agent]\nuser = -1\n", "[agent] user = -1"),
        ("[environment]\nos = \"plan9\"\n", "os"),
        (
            "[[environment.setup_commands]]\ncwd = \"/\"\n",
            "setup_commands[0]",
        ),
        ("[solution]\nenv = {}\n[oracle]\nenv = {}\n", "duplicate"),
    ];
    for (toml, needle) in cases {
        env.write("tasks/bad/task.toml", toml);
        env.write("tasks/bad/instruction.md", "x");
        let out = env.eval_all();
        out.sifbox_error()
            .stderr_has(needle)
            .stderr_has("bad/task.toml");
        assert!(!env.out().exists(), "{toml:?} left {}", env.out().display());
    }
    let _ = good;
}

/// A task whose agent runs as a user of the image writes files of that
/// user's id into the job dir, which an unprivileged caller could neither
/// read nor remove: at the job's end they are the caller's. Symlinks the
/// agent planted are given back themselves, not followed: a file of
/// another id in a bound dir they point at keeps its owner; a FIFO is
/// given back without being opened.
#[test]
fn a_task_users_outputs_are_the_callers_after_the_job() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::with_evalbase();
    let data = env.path("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    env.task(
        "as-user",
        "[agent]\nuser = \"user\"\n",
        "#!/bin/bash\nset -e\nmkdir /logs/agent/private\necho secret > /logs/agent/private/f\n\
chmod 600 /logs/agent/private/f\nchmod 700 /logs/agent/private\n\
echo mine > /logs/agent/out.txt\nchmod 600 /logs/agent/out.txt\n\
echo victim > /data/victim\nchmod 600 /data/victim\n\
ln -s /data/victim /logs/agent/victim\nln -s /data /logs/agent/data\nln -s / /logs/agent/root\n\
mkfifo /logs/agent/fifo\n",
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    );
    let tasks = env.path("tasks").display().to_string();
    let bind = format!("{}:/data", data.display());
    env.eval(&["--job", "j", "--bind", &bind, &tasks])
        .output()
        .success();
    assert_eq!(outcome(&env.result("j", "as-user__1")), ok(1.0));
    let agent = env.out().join("j/as-user__1/agent");
    let read =
        |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(read(&agent.join("out.txt")), "mine\n");
    assert_eq!(read(&agent.join("private/f")), "secret\n");
    for (link, to) in [("victim", "/data/victim"), ("data", "/data"), ("root", "/")] {
        let target = std::fs::read_link(agent.join(link)).expect("still a symlink");
        assert_eq!(target, Path::new(to), "{link}");
    }
    let (uid, gid) = harness::my_ids();
    let victim = std::fs::symlink_metadata(data.join("victim")).expect("victim");
    if uid != 0 {
        // Everything in the job dir is the caller's now...
        let mut stack = vec![env.out().join("j")];
        while let Some(p) = stack.pop() {
            let md = std::fs::symlink_metadata(&p).expect("stat");
            assert_eq!((md.uid(), md.gid()), (uid, gid), "{}", p.display());
            if md.is_dir() {
                stack.extend(
                    std::fs::read_dir(&p)
                        .expect("ls")
                        .flatten()
                        .map(|e| e.path()),
                );
            }
        }
        // ...and nothing beyond it: where the agent user's id is another
        // host id, its file in the bound dir still has that id.
        if harness::has_subid_range() {
            assert_ne!(
                victim.uid(),
                uid,
                "a file outside the job dir was given back"
            );
        }
    }
    // The caller can remove the job (and the victim: its dir is ours).
    std::fs::remove_dir_all(env.out().join("j")).expect("removing the job dir");
}

/// An agent that stops (SIGSTOP) the sandbox process serving it cannot run
/// past its timeout, in a worker or, with a network of its own, in a
/// process of its own: the rollouts end as agent timeouts and the job
/// ends (it waited for ever before).
#[test]
fn an_agent_that_stops_its_server_still_times_out() {
    let env = Env::with_evalbase();
    let stopper =
        "#!/bin/bash\nwhile :; do kill -STOP $PPID; done &\nkill -STOP $PPID\nsleep 1000\n";
    let reward = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n";
    env.task(
        "stops-worker",
        "[agent]\ntimeout_sec = 1\n",
        stopper,
        reward,
    );
    env.task(
        "stops-own-process",
        "[agent]\ntimeout_sec = 1\nnetwork_mode = \"no-network\"\n",
        stopper,
        reward,
    );
    let tasks = env.path("tasks").display().to_string();
    let t = Instant::now();
    let out = env
        .eval(&["--job", "j", "--jobs", "2", &tasks])
        .timeout(Duration::from_secs(120))
        .output();
    out.success();
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    for task in ["stops-worker", "stops-own-process"] {
        let r = env.result("j", &format!("{task}__1"));
        assert_eq!(outcome(&r), failed("agent_timeout", Some(1.0)), "{r:#}");
        assert_eq!(r["agent_run"]["exit_code"], 124, "{r:#}");
    }
}
