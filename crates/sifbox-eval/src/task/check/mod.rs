//! The checks of task.toml: each value read by serde into the raw model
//! ([`super::model`]) is checked here, section by section, into a
//! [`TaskConfig`]; what sifbox cannot honour is collected as `unsupported`.

mod environment;
mod steps;
mod values;
mod verifier;

pub use values::{parse_memory, valid_name, valid_step_name};

use super::keys::{self, is_env_shorthand};
use super::model::{RawSolution, RawTaskToml, VerifierMode};
use super::{
    bad, Limits, TaskConfig, DEFAULT_AGENT_TIMEOUT_SEC, DEFAULT_BUILD_TIMEOUT_SEC,
    DEFAULT_VERIFIER_TIMEOUT_SEC,
};
use crate::error::Result;
use values::{check_env, check_user, timeout};

/// Parses and checks the text of a task.toml; `file` names it in errors.
pub fn parse_config(text: &str, file: &str) -> Result<TaskConfig> {
    let raw: RawTaskToml = toml::from_str(text).map_err(|e| {
        // toml's message spans lines (with a snippet): keep it on one.
        let msg = e.message().trim().replace('\n', " ");
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!(":{line}")
            })
            .unwrap_or_default();
        bad(
            format!("{file}{at}"),
            format!("not a valid task.toml: {msg}"),
            "fix the TOML (see the task format in README.md)",
        )
    })?;
    let mut config = check_config(raw, file)?;
    // The same text parsed once more as a plain table, for its keys (it
    // parsed above, so it parses here).
    if let Ok(doc) = toml::from_str::<toml::Table>(text) {
        config.warnings = keys::warnings(&doc, file);
    }
    Ok(config)
}

/// The raw model, checked section by section (the first error wins, in
/// the order below).
pub(in crate::task) fn check_config(raw: RawTaskToml, file: &str) -> Result<TaskConfig> {
    let e = raw.environment;
    let mut unsupported = Vec::new();
    let (network, agent_network, verifier_network) =
        environment::networks(&e, &raw.agent, &raw.verifier, &mut unsupported);
    environment::os(e.os.as_deref(), file, &mut unsupported)?;
    let verifier_mode = verifier::mode(&raw.verifier, file)?;
    let verifier_image =
        verifier::image(raw.verifier.environment.as_ref(), file, &mut unsupported)?;
    verifier::kind(raw.verifier.kind.as_deref(), file, &mut unsupported)?;
    let (memory_mb, storage_mb) = environment::resources(&e, file, &mut unsupported)?;
    let docker_image = environment::docker_image(e.docker_image, file)?;
    let workdir = environment::workdir(e.workdir, file)?;
    let healthcheck = e
        .healthcheck
        .map(|h| environment::healthcheck(h, file))
        .transpose()?;
    let setup_commands = environment::setup_commands(e.setup_commands, file, &mut unsupported)?;
    let solution_env = solution_env(raw.solution, file)?;
    let agent_timeout = timeout(
        raw.agent.timeout_sec,
        DEFAULT_AGENT_TIMEOUT_SEC,
        "[agent] timeout_sec",
        file,
    )?;
    let agent_user = check_user(raw.agent.user, "[agent] user", file)?;
    let verifier_timeout = timeout(
        raw.verifier.timeout_sec,
        DEFAULT_VERIFIER_TIMEOUT_SEC,
        "[verifier] timeout_sec",
        file,
    )?;
    let verifier_user = check_user(raw.verifier.user, "[verifier] user", file)?;
    let steps = steps::steps(
        raw.steps.unwrap_or_default(),
        &steps::TaskDefaults {
            agent_timeout,
            agent_user: agent_user.clone(),
            verifier_timeout,
            verifier_user: verifier_user.clone(),
        },
        file,
        &mut unsupported,
    )?;
    if !steps.is_empty() && verifier_mode == VerifierMode::Separate {
        unsupported.push(
            "[[steps]] with a separate verifier: sifbox runs a multi-step task's verifiers in its sandbox only".to_string(),
        );
    }
    Ok(TaskConfig {
        build_timeout: timeout(
            e.build_timeout_sec,
            DEFAULT_BUILD_TIMEOUT_SEC,
            "[environment] build_timeout_sec",
            file,
        )?,
        docker_image,
        limits: Limits {
            cpus: e.cpus,
            memory_mb,
            storage_mb,
            gpus: e.gpus,
            gpu_types: e.gpu_types,
        },
        network,
        agent_network,
        verifier_network,
        env: check_env(e.env, "[environment] env", file)?,
        verifier_env: check_env(raw.verifier.env, "[verifier] env", file)?,
        solution_env: check_env(solution_env, "[solution] env", file)?,
        workdir,
        healthcheck,
        agent_timeout,
        agent_user,
        verifier_timeout,
        verifier_user,
        default_user: None,
        service: None,
        allow_userns: sifbox_flag(&raw.metadata, "allow_userns", file)?,
        setup_commands,
        verifier_mode,
        verifier_image,
        steps,
        reward_strategy: raw.multi_step_reward_strategy.unwrap_or_default(),
        unsupported,
        warnings: Vec::new(),
    })
}

/// `[solution] env`, with BenchFlow's shorthand: `[solution] NAME = "value"`
/// is an env entry.
fn solution_env(
    solution: RawSolution,
    file: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    let mut solution_env = solution.env;
    for (k, v) in solution.rest {
        if let (true, toml::Value::String(v)) = (is_env_shorthand(&k), v) {
            match solution_env.get(&k) {
                Some(old) if *old != v => {
                    return Err(bad(
                        format!("{file}: [solution] {k}"),
                        "set twice, to different values (in env and as a key of its own)",
                        "keep one of them",
                    ))
                }
                _ => {
                    solution_env.insert(k, v);
                }
            }
        }
    }
    Ok(solution_env)
}

/// A boolean of `[metadata.sifbox]`; false when absent.
fn sifbox_flag(metadata: &toml::Table, key: &str, file: &str) -> Result<bool> {
    let Some(table) = metadata.get("sifbox") else {
        return Ok(false);
    };
    let wrong = |why: &str| {
        bad(
            format!("{file}: [metadata.sifbox]"),
            why.to_string(),
            format!("write it as a table: [metadata.sifbox] {key} = true"),
        )
    };
    let toml::Value::Table(t) = table else {
        return Err(wrong("not a table"));
    };
    match t.get(key) {
        None => Ok(false),
        Some(toml::Value::Boolean(b)) => Ok(*b),
        Some(_) => Err(wrong(&format!("{key} must be true or false"))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::task::{NetworkMode, RewardStrategy, SetupCommand};

    fn parse(s: &str) -> Result<TaskConfig> {
        parse_config(s, "t/task.toml")
    }

    #[test]
    fn a_full_task_toml() {
        let c = parse(
            r#"
version = "1.0"
[metadata]
author_name = "x"
difficulty = "easy"
tags = ["a", "b"]
[environment]
build_timeout_sec = 120
cpus = 2
memory_mb = 4096
storage_mb = 2048
network_mode = "no-network"
env = { API = "${KEY:-none}", PLAIN = "v" }
workdir = "/app"
healthcheck = { command = "test -f /ready", interval_sec = 0.5, timeout_sec = 2, retries = 5 }
[agent]
timeout_sec = 30.5
user = "agent"
network_mode = "public"
[verifier]
timeout_sec = 60
env = { MODE = "strict" }
user = "root"
[solution]
env = { HINT = "h" }
"#,
        )
        .expect("valid");
        assert_eq!(c.build_timeout, Duration::from_secs(120));
        assert_eq!(c.network, NetworkMode::NoNetwork);
        assert_eq!(c.agent_network, NetworkMode::Public);
        assert_eq!(c.verifier_network, NetworkMode::NoNetwork);
        assert_eq!(c.agent_timeout, Duration::from_secs_f64(30.5));
        assert_eq!(c.verifier_timeout, Duration::from_secs(60));
        assert_eq!(c.agent_user.as_deref(), Some("agent"));
        assert_eq!(c.workdir.as_deref(), Some("/app"));
        assert_eq!(
            c.env,
            vec![
                ("API".to_string(), "${KEY:-none}".to_string()),
                ("PLAIN".to_string(), "v".to_string())
            ]
        );
        assert_eq!(c.verifier_env, vec![("MODE".into(), "strict".into())]);
        assert_eq!(c.solution_env, vec![("HINT".into(), "h".into())]);
        assert_eq!(
            c.limits,
            Limits {
                cpus: Some(2.0),
                memory_mb: Some(4096),
                storage_mb: Some(2048),
                gpus: None,
                gpu_types: None,
            }
        );
        let h = c.healthcheck.expect("healthcheck");
        assert_eq!(h.argv, ["/bin/sh", "-c", "test -f /ready"]);
        assert_eq!(h.retries, 5);
        assert_eq!(h.interval, Duration::from_millis(500));
    }

    #[test]
    fn defaults_and_legacy_keys() {
        let c = parse("").expect("empty is valid");
        assert_eq!(c.network, NetworkMode::Public);
        assert_eq!(c.agent_timeout, Duration::from_secs(600));
        assert_eq!(c.verifier_timeout, Duration::from_secs(600));
        assert!(c.docker_image.is_none() && c.healthcheck.is_none());
        let c = parse("[environment]\nallow_internet = false\nmemory = \"2G\"").expect("legacy");
        assert_eq!(c.network, NetworkMode::NoNetwork);
        assert_eq!(c.agent_network, NetworkMode::NoNetwork);
        assert_eq!(c.limits.memory_mb, Some(2048));
        let c = parse("[environment]\nallow_internet = true").expect("legacy");
        assert_eq!(c.network, NetworkMode::Public);
        let c = parse("[verifier]\nnetwork_mode = \"no-network\"").expect("override");
        assert_eq!(
            (c.network, c.agent_network, c.verifier_network),
            (
                NetworkMode::Public,
                NetworkMode::Public,
                NetworkMode::NoNetwork
            )
        );
    }

    #[test]
    fn what_harbor_and_benchflow_accept() {
        // Users as numbers (Harbor and BenchFlow: str | int).
        let c = parse("[agent]\nuser = 1000\n[verifier]\nuser = 0\n").expect("numeric users");
        assert_eq!(c.agent_user.as_deref(), Some("1000"));
        assert_eq!(c.verifier_user.as_deref(), Some("0"));
        // BenchFlow's spellings: [oracle], [sandbox], image, the [solution]
        // env shorthand, [reward] metadata.
        let c = parse(
            "[sandbox]\nimage = \"busybox\"\n[oracle]\nenv = { A = \"1\" }\nTOKEN = \"${T:-x}\"\n[reward]\nexpr = \"mean(a)\"\n",
        )
        .expect("benchflow");
        assert_eq!(c.docker_image.as_deref(), Some("busybox"));
        assert_eq!(
            c.solution_env,
            vec![("A".into(), "1".into()), ("TOKEN".into(), "${T:-x}".into())]
        );
        assert!(c.warnings.is_empty() && c.unsupported.is_empty(), "{c:?}");
        // Legacy sizes.
        let c = parse("[environment]\nstorage = \"10G\"\nmemory = \"512M\"").expect("legacy");
        assert_eq!(
            (c.limits.storage_mb, c.limits.memory_mb),
            (Some(10240), Some(512))
        );
        // os, verifier type: the values that run.
        let c = parse("[environment]\nos = \"Linux\"\n[verifier]\ntype = \"test-script\"")
            .expect("linux");
        assert!(c.unsupported.is_empty());
        // Setup commands, with their defaults.
        let c = parse(
            "[[environment.setup_commands]]\ncommand = \" echo a \"\n[[environment.setup_commands]]\ncommand = \"b\"\ntimeout_sec = 5\ncwd = \"/srv\"\nuser = 1000\nenv = { K = \"${V:-d}\" }\nhost_lock = \"db\"\nservice = \"main\"\n",
        )
        .expect("setup");
        assert_eq!(
            c.setup_commands,
            vec![
                SetupCommand {
                    command: "echo a".into(),
                    timeout: Duration::from_secs(600),
                    cwd: None,
                    env: vec![],
                    user: None,
                    host_lock: None,
                },
                SetupCommand {
                    command: "b".into(),
                    timeout: Duration::from_secs(5),
                    cwd: Some("/srv".into()),
                    env: vec![("K".into(), "${V:-d}".into())],
                    user: Some("1000".into()),
                    host_lock: Some("db".into()),
                },
            ]
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_collected_per_field() {
        let cases = [
            ("[environment]\nos = \"windows\"", "[environment] os = \"windows\""),
            ("[environment]\nos = \"WINDOWS\"", "[environment] os = \"windows\""),
            ("[verifier]\ntype = \"llm-judge\"", "[verifier] type = \"llm-judge\""),
            (
                "[[environment.mcp_servers]]\nname = \"m\"\nurl = \"http://x\"",
                "[environment] mcp_servers",
            ),
            (
                "[environment]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\"example.com\"]",
                "[environment] network_mode = \"allowlist\"",
            ),
            ("[agent]\nnetwork_mode = \"allowlist\"", "[agent] network_mode = \"allowlist\""),
            (
                "[environment]\nnetwork_mode = \"denylist\"\nblocked_hosts = [\"x.com\"]",
                "[environment] network_mode = \"denylist\"",
            ),
            ("[verifier]\nnetwork_mode = \"denylist\"", "[verifier] network_mode = \"denylist\""),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\nservice = \"db\"",
                "setup_commands[0] service = \"db\"",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\ncapture_dir = \"/a\"\ncapture_dir_b64_env = \"A\"",
                "setup_commands[0] capture_dir",
            ),
        ];
        for (text, needle) in cases {
            let c = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(c.unsupported.len(), 1, "{text:?}: {:?}", c.unsupported);
            assert!(
                c.unsupported[0].contains(needle),
                "{text:?}: {:?}",
                c.unsupported
            );
            assert!(!c.unsupported[0].contains('\n'));
        }
        // An empty list of MCP servers asks for nothing.
        assert!(parse("[environment]\nmcp_servers = []")
            .expect("empty")
            .unsupported
            .is_empty());
        // Several at once: each named.
        let c = parse("[environment]\nos = \"windows\"\nnetwork_mode = \"allowlist\"\n[verifier]\ntype = \"llm-judge\"").expect("three");
        assert_eq!(c.unsupported.len(), 3, "{:?}", c.unsupported);
    }

    #[test]
    fn healthcheck_fields_and_defaults_are_harbors() {
        let h = parse("[environment.healthcheck]\ncommand = \"true\"")
            .expect("defaults")
            .healthcheck
            .expect("healthcheck");
        assert_eq!(h.interval, Duration::from_secs(5));
        assert_eq!(h.timeout, Duration::from_secs(30));
        assert_eq!(h.start_period, Duration::ZERO);
        assert_eq!(h.start_interval, Duration::from_secs(5));
        assert_eq!(h.retries, 3);
        let h = parse("[environment.healthcheck]\ncommand = \"true\"\ninterval_sec = 0\nstart_interval_sec = 0.25\nstart_period_sec = 2\ntimeout_sec = 1\nretries = 0")
            .expect("set")
            .healthcheck
            .expect("healthcheck");
        assert_eq!(h.interval, Duration::ZERO);
        assert_eq!(h.start_interval, Duration::from_millis(250));
        assert_eq!(h.start_period, Duration::from_secs(2));
        assert_eq!(h.timeout, Duration::from_secs(1));
        assert_eq!(
            h.retries, 1,
            "Harbor's 0 retries fail at the first failure, as 1"
        );
    }

    #[test]
    fn unknown_keys_are_warned_about_never_silently_dropped() {
        let c = parse("[agent]\ntimeout_secs = 5\n[verifer]\ntimeout_sec = 1\n")
            .expect("warnings only");
        assert_eq!(
            c.agent_timeout,
            Duration::from_secs(600),
            "the misspelt key is not used"
        );
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("did you mean `timeout_sec`?"),
            "{:?}",
            c.warnings
        );
        assert!(
            c.warnings[1].contains("did you mean `verifier`?"),
            "{:?}",
            c.warnings
        );
        assert!(c.warnings.iter().all(|w| w.starts_with("t/task.toml: ")));
    }

    #[test]
    fn bad_values_are_refused_with_where_and_what() {
        let cases = [
            (
                "[environment]\nnetwork_mode = \"bridge\"",
                "unknown variant",
            ),
            ("[agent]\ntimeout_sec = -1", "timeout_sec"),
            ("[agent]\ntimeout_sec = 1e300", "timeout_sec"),
            ("[agent]\ntimeout_sec = nan", "timeout_sec"),
            ("[agent]\ntimeout_sec = \"ten\"", "invalid type"),
            ("[verifier]\nenv = { \"1BAD\" = \"x\" }", "variable name"),
            ("[verifier]\nenv = { A = \"${B\" }", "unterminated"),
            ("[environment]\nworkdir = \"relative\"", "absolute"),
            ("[environment]\nmemory = \"lots\"", "memory"),
            ("[environment]\nstorage_mb = 0", "storage_mb"),
            ("[environment]\nstorage = \"0\"", "storage_mb"),
            ("[environment]\nstorage = \"big\"", "storage"),
            ("[environment]\nmemory_mb = 0", "memory_mb"),
            ("[environment]\nmemory = \"0G\"", "memory_mb"),
            ("[environment]\nmemory_mb = 2000000000000", "too large"),
            (
                "[environment]\nmemory_mb = 1024\nmemory = \"2G\"",
                "disagree",
            ),
            (
                "[environment]\nstorage_mb = 1024\nstorage = \"2G\"",
                "disagree",
            ),
            ("[environment]\ncpus = 0", "cpus"),
            ("[environment]\ncpus = -1", "cpus"),
            ("[environment]\ncpus = 1e300", "cpus"),
            ("[environment]\ncpus = nan", "cpus"),
            ("[environment]\ngpus = -1", "invalid value"),
            ("[environment]\ngpu_types = [\"\"]", "gpu_types"),
            ("[environment]\ndocker_image = \" \"", "docker_image"),
            (
                "[environment]\nhealthcheck = { interval_sec = 1 }",
                "no command",
            ),
            ("[agent]\nuser = \"\"", "user"),
            ("[agent]\nuser = -1", "user"),
            ("[verifier]\nuser = 4294967296", "user"),
            ("[agent]\nuser = 1.5", "expected a user"),
            ("[environment]\nos = \"plan9\"", "os"),
            ("[verifier]\ntype = \"vibes\"", "type"),
            ("[environment]\nmcp_servers = \"x\"", "expected a sequence"),
            (
                "[environment]\nhealthcheck = { command = \"true\", retries = -1 }",
                "retries",
            ),
            (
                "[environment]\nhealthcheck = { command = \"true\", interval_sec = -1 }",
                "interval_sec",
            ),
            ("[[environment.setup_commands]]\ncwd = \"/\"", "no command"),
            (
                "[[environment.setup_commands]]\ncommand = \"  \"",
                "no command",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\ncwd = \"rel\"",
                "absolute",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\ntimeout_sec = 0",
                "timeout_sec",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\nenv = { \"1X\" = \"a\" }",
                "variable name",
            ),
            (
                "[environment]\nsetup_commands = { command = \"x\" }",
                "invalid type",
            ),
            ("[solution]\nenv = { A = \"1\" }\nA = \"2\"", "set twice"),
            ("[solution]\nenv = {}\n[oracle]\nenv = {}", "duplicate"),
            (
                "[environment]\ndocker_image = \"a\"\nimage = \"b\"",
                "duplicate",
            ),
            ("[environment]\ncpus = 1\n[sandbox]\ncpus = 2", "duplicate"),
            ("reward = 1\n", "invalid type"),
            ("[environment\n", "not a valid task.toml"),
        ];
        for (text, needle) in cases {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(e.contains("t/task.toml"), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{text:?}: more than one line: {e}");
        }
    }

    #[test]
    fn resources_and_their_legacy_spellings() {
        let c = parse(
            "[environment]\ncpus = 0.5\nmemory = \"1.5G\"\nstorage = \"20G\"\ngpus = 2\ngpu_types = [\"H100\", \"A100\"]",
        )
        .expect("legacy sizes");
        assert_eq!(
            c.limits,
            Limits {
                cpus: Some(0.5),
                memory_mb: Some(1536),
                storage_mb: Some(20480),
                gpus: Some(2),
                gpu_types: Some(vec!["H100".into(), "A100".into()]),
            }
        );
        // Both spellings, agreeing: accepted (as Harbor does).
        let c = parse("[environment]\nmemory_mb = 2048\nmemory = \"2G\"\nstorage_mb = 512\nstorage = \"512M\"")
            .expect("agreeing");
        assert_eq!(
            (c.limits.memory_mb, c.limits.storage_mb),
            (Some(2048), Some(512))
        );
        // An integer number of CPUs, and none at all.
        assert_eq!(
            parse("[environment]\ncpus = 2").expect("int").limits.cpus,
            Some(2.0)
        );
        assert_eq!(parse("").expect("empty").limits, Limits::default());
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("2G"), Some(2048));
        assert_eq!(parse_memory("512m"), Some(512));
        assert_eq!(parse_memory("1.5G"), Some(1536));
        assert_eq!(parse_memory("1048576"), Some(1));
        assert_eq!(parse_memory("x"), None);
        assert_eq!(parse_memory("-1G"), None);
        assert_eq!(parse_memory(""), None);
    }

    #[test]
    fn verifier_modes_are_harbors() {
        // Default: shared. An environment implies separate.
        let c = parse("").expect("empty");
        assert_eq!(c.verifier_mode, VerifierMode::Shared);
        let c = parse("[verifier.environment]\ndocker_image = \"v\"\n").expect("env");
        assert_eq!(c.verifier_mode, VerifierMode::Separate);
        assert_eq!(c.verifier_image.as_deref(), Some("v"));
        let c = parse("[verifier]\nenvironment_mode = \"separate\"\n").expect("separate");
        assert_eq!(
            (c.verifier_mode, c.verifier_image),
            (VerifierMode::Separate, None)
        );
        // BenchFlow's spellings.
        let c =
            parse("[verifier]\nsandbox_mode = \"separate\"\n[verifier.sandbox]\nimage = \"w\"\n")
                .expect("benchflow");
        assert_eq!(c.verifier_image.as_deref(), Some("w"));
        // Shared with an environment of its own is Harbor's ValueError.
        let e = parse("[verifier]\nenvironment_mode = \"shared\"\n[verifier.environment]\n")
            .expect_err("shared + env");
        assert!(
            e.to_string().contains("environment_mode = \"shared\""),
            "{e}"
        );
        for bad in [
            "[verifier]\nenvironment_mode = \"apart\"\n",
            "[verifier.environment]\ndocker_image = \" \"\n",
            "[verifier.environment]\nos = \"plan9\"\n",
        ] {
            parse(bad).expect_err(bad);
        }
        let c = parse("[verifier.environment]\nos = \"windows\"\n").expect("windows");
        assert!(
            c.unsupported[0].contains("[verifier.environment] os"),
            "{c:?}"
        );
    }

    #[test]
    fn steps_are_parsed_as_harbor_writes_them() {
        let c = parse(
            "multi_step_reward_strategy = \"final\"\n[agent]\ntimeout_sec = 9\nuser = \"u\"\n[[steps]]\nname = \"one\"\nmin_reward = 1\n[[steps]]\nname = \"two\"\nmin_reward = { reward = 0.5, acc = 0 }\n[steps.agent]\ntimeout_sec = 3\n[steps.verifier]\nuser = 7\nenv = { K = \"v\" }\n",
        )
        .expect("steps");
        assert_eq!(c.reward_strategy, RewardStrategy::Final);
        assert_eq!(c.steps.len(), 2);
        let (one, two) = (&c.steps[0], &c.steps[1]);
        assert_eq!(one.name, "one");
        // The task's values where a step sets none.
        assert_eq!(one.agent_timeout, Duration::from_secs(9));
        assert_eq!(one.agent_user.as_deref(), Some("u"));
        assert_eq!(
            one.min_reward,
            Some(BTreeMap::from([("reward".into(), 1.0)]))
        );
        assert_eq!(two.agent_timeout, Duration::from_secs(3));
        assert_eq!(two.verifier_user.as_deref(), Some("7"));
        assert_eq!(two.verifier_env, vec![("K".into(), "v".into())]);
        assert_eq!(
            two.min_reward,
            Some(BTreeMap::from([
                ("reward".into(), 0.5),
                ("acc".into(), 0.0)
            ]))
        );
        assert!(c.unsupported.is_empty() && c.warnings.is_empty(), "{c:?}");
        // Mean by default.
        let c = parse("[[steps]]\nname = \"a\"\n").expect("default");
        assert_eq!(c.reward_strategy, RewardStrategy::Mean);
        // Harbor's refusals: no name, a name that is no portable dir name,
        // a name twice (without case), a bad strategy or threshold.
        for bad in [
            "[[steps]]\nmin_reward = 1\n",
            "[[steps]]\nname = \"a/b\"\n",
            "[[steps]]\nname = \"..\"\n",
            "[[steps]]\nname = \"x.\"\n",
            "[[steps]]\nname = \"CON\"\n",
            "[[steps]]\nname = \"a\"\n[[steps]]\nname = \"A\"\n",
            "multi_step_reward_strategy = \"max\"\n[[steps]]\nname = \"a\"\n",
            "[[steps]]\nname = \"a\"\nmin_reward = \"high\"\n",
            "[[steps]]\nname = \"a\"\n[steps.agent]\ntimeout_sec = 0\n",
        ] {
            parse(bad).expect_err(bad);
        }
        assert!(
            valid_step_name("setup.v2") && valid_step_name("com0") && !valid_step_name("lpt1.txt")
        );
        // What a step cannot set here is refused per task.
        let c = parse("[[steps]]\nname = \"a\"\n[steps.healthcheck]\ncommand = \"true\"\n")
            .expect("healthcheck");
        assert!(
            c.unsupported[0].contains("[[steps]] \"a\" healthcheck"),
            "{c:?}"
        );
        let c = parse("[verifier]\nenvironment_mode = \"separate\"\n[[steps]]\nname = \"a\"\n")
            .expect("separate");
        assert!(c.unsupported[0].contains("separate verifier"), "{c:?}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any text: an error or a config, never a panic.
        #[test]
        fn any_text_never_panics(s in "\\PC{0,400}") {
            let _ = parse(&s);
        }

        /// TOML-shaped text with the keys task.toml has and random values:
        /// never a panic, and errors are single lines naming the file.
        #[test]
        fn task_toml_shaped_text(
            section in proptest::sample::select(vec!["environment", "agent", "verifier", "solution", "environment.healthcheck", "metadata", "oracle", "sandbox", "reward", "[environment.setup_commands]", "verifer", "[environment.mcp_servers]"]),
            key in proptest::sample::select(vec![
                "timeout_sec", "build_timeout_sec", "network_mode", "allow_internet", "env",
                "workdir", "user", "cpus", "memory_mb", "memory", "storage_mb", "docker_image",
                "command", "interval_sec", "retries", "start_period_sec", "gpus", "healthcheck",
                "storage", "gpu_types", "os", "type", "image", "mcp_servers", "setup_commands",
                "start_interval_sec", "cwd", "host_lock", "service", "capture_dir", "TOKEN",
                "timeout_secs", "blocked_hosts",
            ]),
            value in proptest::sample::select(vec![
                "1", "-1", "0", "0.0", "1e308", "-0.0", "inf", "nan", "9223372036854775807",
                "\"no-network\"", "\"public\"", "\"allowlist\"", "\"2G\"", "\"/app\"", "\"x\"",
                "true", "false", "[]", "[\"a\"]", "{}", "{ A = \"${B:-c}\" }", "{ A = 1 }",
                "\"${\"", "\"\\u0000\"", "{ command = \"true\" }", "1979-05-27",
                "\"windows\"", "\"llm-judge\"", "\"denylist\"", "[{ command = \"x\", service = \"db\" }]",
                "-4294967297", "4294967296", "\"x.sif\"",
            ]),
        ) {
            let text = format!("[{section}]\n{key} = {value}\n");
            if let Err(e) = parse(&text) {
                let e = e.to_string();
                proptest::prop_assert!(e.contains("t/task.toml"), "{}", e);
                proptest::prop_assert!(!e.contains('\n'), "{}", e);
            }
        }
    }
}
