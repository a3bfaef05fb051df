//! The keys of task.toml that Harbor 0.26 and BenchFlow 0.7.11 know, and
//! what sifbox does with each: used (parsed in `super`), free-form (what
//! is below is the task author's: `[metadata]`, env maps), known but not
//! honoured (a warning says so), or unknown (a warning, with the known key
//! it most looks like). Unknown keys are warned about, never refused:
//! newer schema versions add keys, and Harbor ignores what it does not
//! know.

/// What sifbox does with a key.
#[derive(Debug, Clone, Copy)]
enum Key {
    /// Read by sifbox (its value is checked by the parser).
    Used,
    /// Its content is free-form (nothing below it is checked).
    Free,
    /// Known to Harbor or BenchFlow, not honoured here: the reason.
    Ignored(&'static str),
    /// A table with these keys.
    Table(&'static [(&'static str, Key)]),
    /// An array of tables with these keys.
    Tables(&'static [(&'static str, Key)]),
}

const VERIFIER_SANDBOX: &str =
    "the separate verifier's sandbox gets the image and the rollout's limits, network and env; this key is not read";

/// `[verifier.environment]`: the image is read; the rest of Harbor's
/// `[environment]` schema is known but not honoured there.
const VERIFIER_ENVIRONMENT: &[(&str, Key)] = &[
    ("docker_image", Key::Used),
    ("image", Key::Used),
    ("os", Key::Used),
    ("build_timeout_sec", Key::Ignored(VERIFIER_SANDBOX)),
    ("cpus", Key::Ignored(VERIFIER_SANDBOX)),
    ("memory_mb", Key::Ignored(VERIFIER_SANDBOX)),
    ("storage_mb", Key::Ignored(VERIFIER_SANDBOX)),
    ("memory", Key::Ignored(VERIFIER_SANDBOX)),
    ("storage", Key::Ignored(VERIFIER_SANDBOX)),
    ("gpus", Key::Ignored(VERIFIER_SANDBOX)),
    ("gpu_types", Key::Ignored(VERIFIER_SANDBOX)),
    ("network_mode", Key::Ignored(VERIFIER_SANDBOX)),
    ("allow_internet", Key::Ignored(VERIFIER_SANDBOX)),
    ("allowed_hosts", Key::Ignored(VERIFIER_SANDBOX)),
    ("blocked_urls", Key::Ignored(VERIFIER_SANDBOX)),
    ("blocked_hosts", Key::Ignored(VERIFIER_SANDBOX)),
    ("env", Key::Ignored(VERIFIER_SANDBOX)),
    ("workdir", Key::Ignored(VERIFIER_SANDBOX)),
    ("healthcheck", Key::Ignored(VERIFIER_SANDBOX)),
    ("mcp_servers", Key::Ignored(VERIFIER_SANDBOX)),
    ("setup_commands", Key::Ignored(VERIFIER_SANDBOX)),
    ("tpu", Key::Ignored(VERIFIER_SANDBOX)),
    ("skills_dir", Key::Ignored(VERIFIER_SANDBOX)),
];
/// `[[steps]]`: what a step may set (what sifbox cannot honour there is
/// refused per task by the parser).
const STEP: &[(&str, Key)] = &[
    ("name", Key::Used),
    ("agent", Key::Table(AGENT)),
    ("verifier", Key::Table(VERIFIER)),
    ("min_reward", Key::Used),
    ("healthcheck", Key::Used),
    (
        "artifacts",
        Key::Ignored("sifbox collects no artifacts: the agent writes them to /logs/artifacts"),
    ),
];

const HEALTHCHECK: &[(&str, Key)] = &[
    ("command", Key::Used),
    ("interval_sec", Key::Used),
    ("timeout_sec", Key::Used),
    ("start_period_sec", Key::Used),
    ("start_interval_sec", Key::Used),
    ("retries", Key::Used),
];

const SETUP_COMMAND: &[(&str, Key)] = &[
    ("command", Key::Used),
    ("timeout_sec", Key::Used),
    ("cwd", Key::Used),
    ("env", Key::Free),
    ("user", Key::Used),
    ("service", Key::Used),
    ("host_lock", Key::Used),
    ("capture_dir", Key::Used),
    ("capture_dir_b64_env", Key::Used),
    ("capture_dir_b64_env_file_var", Key::Used),
];

const ENVIRONMENT: &[(&str, Key)] = &[
    ("build_timeout_sec", Key::Used),
    ("docker_image", Key::Used),
    ("image", Key::Used),
    ("os", Key::Used),
    ("cpus", Key::Used),
    ("memory_mb", Key::Used),
    ("storage_mb", Key::Used),
    ("gpus", Key::Used),
    ("gpu_types", Key::Used),
    ("network_mode", Key::Used),
    ("allowed_hosts", Key::Used),
    ("blocked_urls", Key::Used),
    ("blocked_hosts", Key::Used),
    ("env", Key::Free),
    ("workdir", Key::Used),
    ("healthcheck", Key::Table(HEALTHCHECK)),
    ("allow_internet", Key::Used),
    ("memory", Key::Used),
    ("storage", Key::Used),
    ("mcp_servers", Key::Used),
    ("setup_commands", Key::Tables(SETUP_COMMAND)),
    ("tpu", Key::Ignored("sifbox gives sandboxes no TPU")),
    (
        "skills_dir",
        Key::Ignored("sifbox's agents install no skills"),
    ),
    ("bugswarm_image_tag", Key::Free),
];

const AGENT: &[(&str, Key)] = &[
    ("timeout_sec", Key::Used),
    ("user", Key::Used),
    ("network_mode", Key::Used),
    ("allowed_hosts", Key::Used),
    (
        "prompt_prefix",
        Key::Ignored("BenchFlow's agents read it; sifbox's agents get instruction.md as written"),
    ),
];

const VERIFIER: &[(&str, Key)] = &[
    ("timeout_sec", Key::Used),
    ("env", Key::Free),
    ("user", Key::Used),
    ("network_mode", Key::Used),
    ("allowed_hosts", Key::Used),
    ("type", Key::Used),
    ("environment_mode", Key::Used),
    ("environment", Key::Table(VERIFIER_ENVIRONMENT)),
    ("sandbox_mode", Key::Used),
    ("sandbox", Key::Table(VERIFIER_ENVIRONMENT)),
    (
        "collect",
        Key::Ignored("collect hooks run in compose services, which sifbox does not run"),
    ),
    (
        "reward_range",
        Key::Ignored("sifbox records rewards as written, without a range check"),
    ),
    ("service", Key::Free),
    ("judge", Key::Free),
    ("memory", Key::Free),
    ("hardening", Key::Free),
    ("pytest_plugins", Key::Free),
];

const SOLUTION: &[(&str, Key)] = &[
    ("env", Key::Free),
    (
        "timeout_sec",
        Key::Ignored("the oracle runs within [agent] timeout_sec"),
    ),
];

const TOP: &[(&str, Key)] = &[
    ("schema_version", Key::Free),
    ("version", Key::Free),
    ("source", Key::Free),
    ("task", Key::Free),
    ("metadata", Key::Free),
    ("reward", Key::Free),
    ("environment", Key::Table(ENVIRONMENT)),
    ("sandbox", Key::Table(ENVIRONMENT)),
    ("agent", Key::Table(AGENT)),
    ("verifier", Key::Table(VERIFIER)),
    ("solution", Key::Table(SOLUTION)),
    ("oracle", Key::Table(SOLUTION)),
    ("steps", Key::Tables(STEP)),
    ("multi_step_reward_strategy", Key::Used),
    (
        "artifacts",
        Key::Ignored("sifbox collects no artifacts: the agent writes them to /logs/artifacts"),
    ),
];

/// Warnings about the keys of the task.toml `doc` (`file` names it): one
/// line each, for every unknown key (with a did-you-mean) and every known
/// key that sifbox does not honour.
pub(super) fn warnings(doc: &toml::Table, file: &str) -> Vec<String> {
    let mut out = Vec::new();
    walk(doc, TOP, "", file, &mut out);
    out
}

/// `[a.b]` for a table path, `the top level` for none.
fn shown(path: &str) -> String {
    if path.is_empty() {
        "the top level".to_string()
    } else {
        format!("[{path}]")
    }
}

fn walk(
    table: &toml::Table,
    keys: &[(&'static str, Key)],
    path: &str,
    file: &str,
    out: &mut Vec<String>,
) {
    for (k, v) in table {
        let Some((_, key)) = keys.iter().find(|(name, _)| name == k) else {
            // BenchFlow's shorthand: `[solution] NAME = "value"` is env.
            let solution = path == "solution" || path == "oracle";
            if solution && v.is_str() && is_env_shorthand(k) {
                continue;
            }
            let hint = did_you_mean(k, keys)
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_default();
            out.push(format!(
                "{file}: unknown key `{k}` in {} (ignored){hint}",
                shown(path)
            ));
            continue;
        };
        let sub = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match (key, v) {
            (Key::Used | Key::Free, _) => {}
            (Key::Ignored(why), _) => out.push(format!(
                "{file}: [{sub}] is not honoured by sifbox ({why}): ignored"
            )),
            (Key::Table(inner), toml::Value::Table(t)) => walk(t, inner, &sub, file, out),
            (Key::Tables(inner), toml::Value::Array(a)) => {
                for (i, item) in a.iter().enumerate() {
                    if let toml::Value::Table(t) = item {
                        walk(t, inner, &format!("{sub}[{i}]"), file, out);
                    }
                }
            }
            // A wrong type: the parser says so.
            (Key::Table(_) | Key::Tables(_), _) => {}
        }
    }
}

/// The known key closest to `k` (at most 2 edits, or `k` with a suffix
/// more or less), when one is.
fn did_you_mean(k: &str, keys: &[(&'static str, Key)]) -> Option<&'static str> {
    let k = k.to_ascii_lowercase();
    keys.iter()
        .map(|(name, _)| (*name, edit_distance(&k, name)))
        .filter(|(name, d)| *d <= 2.min(name.len() / 3).max(1) || prefix_of(&k, name))
        .min_by_key(|(_, d)| *d)
        .map(|(name, _)| name)
}

/// One is the other with at most 2 characters more at its end
/// (`timeout` / `timeout_sec` is too far, `timeout_secs` / `timeout_sec`
/// is not).
fn prefix_of(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() < b.len() { (a, b) } else { (b, a) };
    short.len() >= 3 && long.starts_with(short) && long.len() - short.len() <= 2
}

/// Levenshtein distance of two (short) keys.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut row = Vec::with_capacity(b.len() + 1);
        row.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            row.push(sub.min(prev[j + 1] + 1).min(row[j] + 1));
        }
        prev = row;
    }
    prev[b.len()]
}

/// Whether `k`, a key of `[solution]` with a string, is an env entry by
/// BenchFlow's shorthand (`[A-Z_][A-Z0-9_]*`).
pub(super) fn is_env_shorthand(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_uppercase() || c == b'_')
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warn(text: &str) -> Vec<String> {
        let doc: toml::Table = toml::from_str(text).expect("toml");
        warnings(&doc, "t/task.toml")
    }

    #[test]
    fn unknown_keys_get_a_did_you_mean() {
        let w = warn("[agent]\ntimeout_secs = 5\n");
        assert_eq!(
            w,
            ["t/task.toml: unknown key `timeout_secs` in [agent] (ignored); did you mean `timeout_sec`?"]
        );
        let w = warn("[verifer]\ntimeout_sec = 5\n");
        assert!(
            w[0].contains("`verifer` in the top level")
                && w[0].contains("did you mean `verifier`?"),
            "{w:?}"
        );
        let w = warn("[environment.healthcheck]\ncommand = \"true\"\nintervall_sec = 1\n");
        assert!(w[0].contains("did you mean `interval_sec`?"), "{w:?}");
        let w = warn("[[environment.setup_commands]]\ncommand = \"true\"\ncmd = 1\n");
        assert!(w[0].contains("[environment.setup_commands[0]]"), "{w:?}");
        // Nothing like it: no guess.
        let w = warn("zzzzzz = 1\n");
        assert!(!w[0].contains("did you mean"), "{w:?}");
    }

    #[test]
    fn known_keys_are_quiet_or_said_to_be_ignored() {
        let quiet = "schema_version = \"1.1\"\n[task]\nname = \"a/b\"\n[metadata]\nanything = 1\n[environment]\ndocker_image = \"x\"\nenv = { ODD_KEY = \"v\" }\n[solution]\nAPI_TOKEN = \"x\"\n[reward]\nexpr = \"a\"\n[verifier.judge]\nmodel = \"m\"\n";
        assert!(warn(quiet).is_empty(), "{:?}", warn(quiet));
        // A separate verifier is honoured: quiet, but for what of its
        // environment's schema is not read.
        let w = warn("[verifier]\nenvironment_mode = \"separate\"\n[verifier.environment]\ndocker_image = \"v\"\nos = \"linux\"\n");
        assert!(w.is_empty(), "{w:?}");
        let w = warn("[verifier]\nsandbox_mode = \"separate\"\n[verifier.sandbox]\nimage = \"v\"\ncpus = 2\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("[verifier.sandbox.cpus] is not honoured"),
            "{w:?}"
        );
        let w = warn("multi_step_reward_strategy = \"final\"\n[[steps]]\nname = \"a\"\nmin_reward = 1\n[steps.agent]\ntimeout_sec = 5\n[[steps]]\nname = \"b\"\nartifacts = [\"/x\"]\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("[steps[1]]") || w[0].contains("artifacts"),
            "{w:?}"
        );
        assert!(
            w.iter().all(|l| l.contains("is not honoured by sifbox")),
            "{w:?}"
        );
        // A lower-case shorthand in [solution] is not an env name.
        assert_eq!(warn("[solution]\nfoo = \"x\"\n").len(), 1);
    }

    #[test]
    fn distances() {
        assert_eq!(edit_distance("verifer", "verifier"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
