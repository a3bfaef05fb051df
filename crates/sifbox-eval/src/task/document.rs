//! BenchFlow's native task document, `task.md` (BenchFlow 0.7.11's
//! `benchflow.task.document`):
//!
//! ```text
//! ---
//! image: busybox              front matter: YAML, task.toml's keys
//! agent: {timeout_sec: 60}    (`sandbox` for [environment], `oracle`
//! ---                         for [solution]) and BenchFlow's shorthands
//! ## prompt
//! The instruction.            the body: its `## prompt` section is the
//!                             instruction (no section: the whole body)
//! ```
//!
//! The front matter goes through the task.toml checks (converted into the
//! TOML value they read), after BenchFlow's normalization: the shorthands
//! `image` (`sandbox.docker_image` unless that is written), `name` (the
//! package name; tasks are named by their dir here, as for `[task] name`),
//! `verifier: PATH` and `oracle: PATH` (the dirs, relative to the task),
//! and the authoring `profile`/`profiles`, whose presets are defaults
//! under what is written. The document-only keys (`agents`, `scenes`,
//! `user`, `benchflow`) are BenchFlow's: multi-role tasks and simulated
//! users make the task `unsupported`; `benchflow` is free-form.

use serde_yaml_ng::{Mapping, Value};

use super::check::check_config;
use super::{bad, keys, yaml, TaskConfig};
use crate::error::Result;

/// The file name.
pub const TASK_MD: &str = "task.md";

/// The sandbox-level parts of BenchFlow's authoring profiles (the rest is
/// metadata for BenchFlow's own checks); profiles sifbox cannot honour are
/// in [`UNSUPPORTED_PROFILES`], and profiles that change nothing about a
/// run are empty.
const PROFILES: &[(&str, &str)] = &[
    (
        "code-change",
        "agent:\n  timeout_sec: 7200\n  network_mode: no-network\nverifier:\n  timeout_sec: 1200\n  user: root\nsandbox:\n  docker_image: ubuntu:24.04\n  network_mode: no-network\n  cpus: 4\n  memory_mb: 8192\n  storage_mb: 10240\n  workdir: /repo\n",
    ),
    ("harbor-compatible", "sandbox:\n  cpus: 1\n  memory_mb: 2048\n"),
    ("acceptance-live", ""),
    ("leaderboard-local", ""),
    ("reward-kit", ""),
    ("multi-agent", ""),
];

const UNSUPPORTED_PROFILES: &[(&str, &str)] = &[
    (
        "reward-kit",
        "a reward-kit verifier (verifier/reward_kit/reward.py); sifbox runs test.sh",
    ),
    (
        "multi-agent",
        "several agent roles and scenes; sifbox runs one agent on the prompt",
    ),
];

/// A task.md, parsed and checked.
#[derive(Debug, Clone)]
pub struct Document {
    pub config: TaskConfig,
    /// The prompt: what the agent gets as /instruction.md.
    pub instruction: String,
    /// `oracle: PATH` and `verifier: PATH`: the dirs, relative to the task
    /// (checked: relative, no `..`).
    pub oracle_dir: Option<String>,
    pub verifier_dir: Option<String>,
}

/// Parses and checks the text of a task.md; `file` names it in errors
/// (`FILE:LINE: ...`, one line).
pub fn parse(text: &str, file: &str) -> Result<Document> {
    let text = text.replace("\r\n", "\n");
    let (front, body, body_line) = split(&text, file)?;
    let at = |line: usize| format!("{file}:{line}");
    let root = match yaml::parse(front, 2) {
        Ok(Value::Null) => Mapping::new(),
        Ok(Value::Mapping(m)) => m,
        Ok(other) => {
            return Err(bad(
                at(2),
                format!("the front matter is {}, not a mapping", yaml::kind(&other)),
                "write the task's keys as `key: value` lines between the --- lines",
            ))
        }
        Err((line, msg)) => {
            return Err(bad(
                at(line),
                format!("the front matter is not valid YAML: {msg}"),
                "fix the YAML between the --- lines (see the task format in README.md)",
            ))
        }
    };
    let mut n = normalize(root, front, file)?;
    let table = match yaml::to_toml(&Value::Mapping(n.root.clone()), "") {
        Ok(Some(toml::Value::Table(t))) => t,
        Ok(_) => toml::Table::new(),
        Err(why) => {
            let path = why.split(':').next().unwrap_or_default().to_string();
            return Err(bad(
                at(yaml::line_of(front, 2, &path)),
                format!("not a valid task.md front matter: {why}"),
                "fix the value (see the task format in README.md)",
            ));
        }
    };
    let raw: super::RawTaskToml =
        serde_path_to_error::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
            let path = e.path().to_string();
            bad(
                at(yaml::line_of(front, 2, &path)),
                format!(
                    "not a valid task.md front matter: {path}: {}",
                    yaml::one_line(&e.inner().to_string())
                ),
                "fix the value (see the task format in README.md)",
            )
        })?;
    let mut config = check_config(raw, file)?;
    config.unsupported.append(&mut n.unsupported);
    config.warnings = n.warnings;
    config.warnings.extend(keys::warnings(&table, file));
    let instruction = prompt(body, file, body_line)?;
    Ok(Document {
        config,
        instruction,
        oracle_dir: n.oracle_dir,
        verifier_dir: n.verifier_dir,
    })
}

/// The front matter (between the first line, `---`, and the next `---`
/// line), the body after it and the body's first line.
fn split<'a>(text: &'a str, file: &str) -> Result<(&'a str, &'a str, usize)> {
    let fix = "start task.md with a --- line, then the YAML front matter, then a --- line, then the markdown with the prompt";
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim) != Some("---") {
        return Err(bad(
            format!("{file}:1"),
            "task.md must start with YAML front matter (a --- line)",
            fix,
        ));
    }
    let start = text.find('\n').map_or(text.len(), |i| i + 1);
    let mut offset = start;
    for line in lines {
        if line.trim() == "---" {
            let front = &text[start..offset];
            let rest = &text[offset + line.len()..];
            let body = rest.trim_start_matches('\n');
            let body_line =
                text[..offset + line.len()].matches('\n').count() + 1 + (rest.len() - body.len());
            return Ok((front, body, body_line));
        }
        offset += line.len();
    }
    Err(bad(
        format!("{file}:1"),
        "the front matter has no closing --- line",
        fix,
    ))
}

/// What normalization leaves: the front matter as task.toml's keys, and
/// what it found on the way.
struct Normalized {
    root: Mapping,
    oracle_dir: Option<String>,
    verifier_dir: Option<String>,
    unsupported: Vec<String>,
    warnings: Vec<String>,
}

fn key(s: &str) -> Value {
    Value::String(s.to_string())
}

/// BenchFlow's normalization of the front matter (see the module's note).
fn normalize(mut root: Mapping, front: &str, file: &str) -> Result<Normalized> {
    let at = |k: &str| format!("{file}:{}", yaml::line_of(front, 2, k));
    let mut unsupported = Vec::new();
    let mut warnings = Vec::new();
    // Profiles: presets under what is written.
    let mut defaults = Mapping::new();
    for k in ["profile", "profiles"] {
        let Some(v) = root.remove(key(k)) else {
            continue;
        };
        let names = match v {
            Value::Sequence(s) => s,
            other => vec![other],
        };
        for name in names {
            let preset = match &name {
                Value::String(s) => PROFILES.iter().find(|(p, _)| *p == s.trim()),
                _ => None,
            };
            let Some((profile, preset)) = preset else {
                let known: Vec<&str> = PROFILES.iter().map(|(p, _)| *p).collect();
                return Err(bad(
                    at(k),
                    format!("{k}: {} is not a task.md profile", show(&name)),
                    format!("name one of {}", known.join(", ")),
                ));
            };
            if let Some((_, why)) = UNSUPPORTED_PROFILES.iter().find(|(p, _)| p == profile) {
                unsupported.push(format!("{k}: {profile}: {why}"));
            }
            if let Ok(Value::Mapping(m)) = serde_yaml_ng::from_str::<Value>(preset) {
                merge(&mut defaults, m);
            }
        }
    }
    let name = root.remove(key("name"));
    if let Some(v) = &name {
        if !matches!(v, Value::String(s) if !s.trim().is_empty()) {
            return Err(bad(
                at("name"),
                format!("name: {} is not a task name", show(v)),
                "write a non-empty string, or leave it out (sifbox names tasks by their directory)",
            ));
        }
    }
    let image = root.remove(key("image"));
    let oracle_dir = path_shorthand(&mut root, "oracle", &at)?;
    let verifier_dir = path_shorthand(&mut root, "verifier", &at)?;
    // The document-only keys.
    let has_entries = |v: Option<&Value>| match v {
        Some(Value::Mapping(m)) => !m.is_empty(),
        Some(Value::Sequence(s)) => !s.is_empty(),
        Some(Value::Null) | None => false,
        Some(_) => true,
    };
    let agents = root.remove(key("agents"));
    let roles = agents.as_ref().and_then(|a| a.get("roles"));
    if has_entries(roles) {
        unsupported.push(
            "agents.roles: several agent roles; sifbox runs one agent on the prompt".to_string(),
        );
    }
    if has_entries(root.remove(key("scenes")).as_ref()) {
        unsupported
            .push("scenes: multi-scene tasks; sifbox runs one agent on the prompt".to_string());
    }
    if has_entries(root.remove(key("user")).as_ref()) {
        unsupported.push("user: a simulated user; sifbox has none".to_string());
    }
    root.remove(key("benchflow"));
    // BenchFlow's native spelling is `sandbox`; it refuses `environment`
    // in task.md. Accepted here as in task.toml, with a warning.
    if root.contains_key(key("environment")) {
        warnings.push(format!(
            "{}: `environment` is task.toml's spelling; BenchFlow 0.7.11 refuses it in task.md (write `sandbox`)",
            at("environment")
        ));
        if !root.contains_key(key("sandbox")) {
            if let Some(v) = root.remove(key("environment")) {
                root.insert(key("sandbox"), v);
            }
        }
    }
    if let Some(v) = image {
        let explicit = ["docker_image", "image"]
            .iter()
            .any(|k| root.get("sandbox").and_then(|s| s.get(*k)).is_some());
        match v {
            Value::String(s) if !s.trim().is_empty() => {
                if !explicit {
                    let mut sandbox = match root.remove(key("sandbox")) {
                        Some(Value::Mapping(m)) => m,
                        Some(Value::Null) | None => Mapping::new(),
                        Some(other) => {
                            return Err(bad(
                                at("sandbox"),
                                format!("sandbox: {} is not a mapping", show(&other)),
                                "write sandbox's keys below it (docker_image: ..., cpus: ...)",
                            ))
                        }
                    };
                    sandbox.insert(key("docker_image"), Value::String(s.trim().to_string()));
                    root.insert(key("sandbox"), Value::Mapping(sandbox));
                }
            }
            other => {
                return Err(bad(
                    at("image"),
                    format!("image: {} is not an image", show(&other)),
                    "name an image (a store name, docker://REF or a .sif file), or leave it out",
                ))
            }
        }
    }
    merge(&mut defaults, root);
    Ok(Normalized {
        root: defaults,
        oracle_dir,
        verifier_dir,
        unsupported,
        warnings,
    })
}

/// A value as it might be shown in a message (short).
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => yaml::kind(other).to_string(),
    }
}

/// `oracle: PATH` / `verifier: PATH` (a mapping is the section itself):
/// the path, relative and without `..`.
fn path_shorthand(
    root: &mut Mapping,
    k: &str,
    at: &dyn Fn(&str) -> String,
) -> Result<Option<String>> {
    match root.get(k) {
        None | Some(Value::Null | Value::Mapping(_)) => Ok(None),
        Some(Value::String(s))
            if !s.trim().is_empty()
                && !s.trim().starts_with('/')
                && !s.contains('\0')
                && !s.trim().split('/').any(|c| c == "..") =>
        {
            let p = s.trim().trim_end_matches('/').to_string();
            root.remove(key(k));
            Ok(Some(if p.is_empty() { ".".into() } else { p }))
        }
        Some(other) => Err(bad(
            at(k),
            format!("{k}: {} is not a mapping or a relative path", show(other)),
            format!(
                "write {k}'s keys below it, or a path in the task's directory (e.g. {k}: {k}/)"
            ),
        )),
    }
}

/// Merges `over` into `base`: mappings key by key, anything else replaced.
fn merge(base: &mut Mapping, over: Mapping) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Mapping(b)), Value::Mapping(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// A `## prompt`-style heading of BenchFlow's (`prompt`, `role:NAME`,
/// `scene:NAME`, `user-persona`, any case), as its section key.
fn heading(line: &str) -> Option<String> {
    let rest = line.trim_end().strip_prefix("##")?;
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let name = rest.trim_start();
    let lower = name.to_ascii_lowercase();
    if lower == "prompt" || lower == "user-persona" {
        return Some(lower);
    }
    for p in ["role:", "scene:"] {
        if lower.starts_with(p) {
            let suffix = &name[p.len()..];
            if !suffix.is_empty()
                && suffix
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            {
                return Some(format!("{p}{suffix}"));
            }
        }
    }
    None
}

/// The instruction: the `## prompt` section of the body, else the text
/// before the first section, else the whole body; trimmed, escaped
/// headings (`\## prompt`) unescaped. `first_line` is the body's line in
/// the file (for errors).
fn prompt(body: &str, file: &str, first_line: usize) -> Result<String> {
    let mut sections: Vec<(String, String)> = Vec::new();
    let mut preamble = String::new();
    for (i, line) in body.split_inclusive('\n').enumerate() {
        if let Some(k) = heading(line) {
            if sections.iter().any(|(s, _)| *s == k) {
                return Err(bad(
                    format!("{file}:{}", first_line + i),
                    format!("task.md has two ## {k} sections"),
                    "keep one of them",
                ));
            }
            sections.push((k, String::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push_str(line);
        } else {
            preamble.push_str(line);
        }
    }
    let text = sections
        .into_iter()
        .find(|(k, _)| k == "prompt")
        .map_or(preamble, |(_, t)| t);
    let unescaped: Vec<&str> = text
        .trim()
        .split('\n')
        .map(|l| match l.strip_prefix('\\') {
            Some(rest) if heading(rest).is_some() => rest,
            _ => l,
        })
        .collect();
    Ok(unescaped.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(s: &str) -> Result<Document> {
        parse(s, "t/task.md")
    }

    #[test]
    fn front_matter_and_prompt() {
        let d = doc("---\nimage: busybox\nagent:\n  timeout_sec: 30\n  user: 1000\nverifier:\n  env: {MODE: strict}\noracle:\n  env: {HINT: h}\nsandbox:\n  cpus: 0.5\n  env:\n    A: \"${B:-c}\"\nmetadata: {difficulty: easy}\nname: demo\n---\nIgnored preamble.\n\n## prompt\n\nDo the thing.\n\\## prompt\nstill prompt\n\n## role:reviewer\nnot the prompt\n")
            .expect("valid");
        let c = &d.config;
        assert_eq!(c.docker_image.as_deref(), Some("busybox"));
        assert_eq!(c.agent_timeout, std::time::Duration::from_secs(30));
        assert_eq!(c.agent_user.as_deref(), Some("1000"));
        assert_eq!(c.limits.cpus, Some(0.5));
        assert_eq!(c.env, [("A".to_string(), "${B:-c}".to_string())]);
        assert_eq!(c.verifier_env, [("MODE".to_string(), "strict".to_string())]);
        assert_eq!(c.solution_env, [("HINT".to_string(), "h".to_string())]);
        assert!(c.unsupported.is_empty() && c.warnings.is_empty(), "{c:?}");
        assert_eq!(d.instruction, "Do the thing.\n## prompt\nstill prompt");
        // No section: the whole body; CRLF and an empty front matter.
        let d = doc("---\r\n---\r\n\r\nJust this.\r\n").expect("empty front matter");
        assert_eq!(d.instruction, "Just this.");
        assert!(d.config.docker_image.is_none());
        // An explicit docker_image wins over the shorthand.
        let d = doc("---\nimage: a\nsandbox:\n  docker_image: b\n---\nx").expect("both");
        assert_eq!(d.config.docker_image.as_deref(), Some("b"));
    }

    #[test]
    fn shorthands_profiles_and_document_keys() {
        let d = doc("---\nprofile: harbor-compatible\nsandbox:\n  memory_mb: 512\nverifier: checks/\noracle: ref\n---\nx")
            .expect("valid");
        assert_eq!(d.config.limits.cpus, Some(1.0), "the profile's");
        assert_eq!(d.config.limits.memory_mb, Some(512), "written wins");
        assert_eq!(d.verifier_dir.as_deref(), Some("checks"));
        assert_eq!(d.oracle_dir.as_deref(), Some("ref"));
        let d = doc("---\nprofiles: [code-change]\n---\nx").expect("code-change");
        assert_eq!(d.config.workdir.as_deref(), Some("/repo"));
        assert_eq!(d.config.docker_image.as_deref(), Some("ubuntu:24.04"));
        let d = doc("---\nprofile: multi-agent\nagents:\n  roles:\n    a: {agent: x}\nscenes: [{name: s}]\nuser: {model: m}\nbenchflow: {anything: 1}\n---\nx")
            .expect("loads");
        assert_eq!(d.config.unsupported.len(), 4, "{:?}", d.config.unsupported);
        let d = doc("---\nenvironment:\n  cpus: 2\n---\nx").expect("task.toml's spelling");
        assert_eq!(d.config.limits.cpus, Some(2.0));
        assert!(
            d.config.warnings[0].contains("sandbox"),
            "{:?}",
            d.config.warnings
        );
        let d = doc("---\nagent:\n  timeout_secs: 5\n---\nx").expect("unknown key");
        assert!(d.config.warnings[0].contains("did you mean `timeout_sec`?"));
    }

    #[test]
    fn malformed_documents_cite_the_file_and_line() {
        let cases = [
            ("no front matter\n", "t/task.md:1", "must start"),
            ("---\na: 1\n", "t/task.md:1", "closing"),
            (
                "---\nagent:\n  timeout_sec: [\n---\nx",
                "t/task.md:",
                "not valid YAML",
            ),
            ("---\n- a\n- b\n---\nx", "t/task.md:2", "not a mapping"),
            (
                "---\nname: demo\nagent:\n  user: x\n  timeout_sec: soon\n---\nx",
                "t/task.md:5",
                "agent.timeout_sec",
            ),
            (
                "---\nagent:\n  timeout_sec: -1\n---\nx",
                "t/task.md",
                "timeout_sec",
            ),
            (
                "---\nprofile: nope\n---\nx",
                "t/task.md:2",
                "not a task.md profile",
            ),
            (
                "---\nverifier: ../up\n---\nx",
                "t/task.md:2",
                "relative path",
            ),
            ("---\nimage: 3\n---\nx", "t/task.md:2", "not an image"),
            (
                "---\nsandbox:\n  gpu_types: [a, ~]\n---\nx",
                "t/task.md:3",
                "null in a list",
            ),
            (
                "---\n---\n## prompt\na\n## PROMPT\nb\n",
                "t/task.md:5",
                "two ## prompt",
            ),
        ];
        for (text, at, needle) in cases {
            let e = doc(text).expect_err(text).to_string();
            assert!(e.contains(at) && e.contains(needle), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{text:?}: {e}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any text: a document or an error, never a panic.
        #[test]
        fn any_text_never_panics(s in "\\PC{0,400}") {
            let _ = doc(&s);
            let _ = doc(&format!("---\n{s}\n---\n{s}"));
        }

        /// Front matter of task.md's keys with random values and shapes:
        /// never a panic; errors are one line naming the file.
        #[test]
        fn front_matter_shaped_text(
            k1 in proptest::sample::select(vec!["agent", "verifier", "sandbox", "environment", "oracle", "image", "name", "profile", "agents", "scenes", "user", "benchflow", "metadata", "solution"]),
            k2 in proptest::sample::select(vec!["timeout_sec", "user", "env", "cpus", "memory_mb", "docker_image", "roles", "healthcheck", "network_mode", "setup_commands", "x"]),
            v in proptest::sample::select(vec!["1", "-1", "~", "[]", "{}", "[~]", "x", "\"${\"", "no-network", "1e400", "18446744073709551616", "{A: 1}", "[{command: x}]", "&a [*a]", "!!binary aGk=", "code-change", "'../x'", "{? [a] : b}"]),
            flow in proptest::bool::ANY,
        ) {
            let text = if flow {
                format!("---\n{k1}: {{{k2}: {v}}}\n---\n## prompt\nx\n")
            } else {
                format!("---\n{k1}:\n  {k2}: {v}\n---\nx\n")
            };
            if let Err(e) = doc(&text) {
                let e = e.to_string();
                proptest::prop_assert!(e.contains("t/task.md"), "{}", e);
                proptest::prop_assert!(!e.contains('\n'), "{}", e);
            }
            let plain = format!("---\n{k1}: {v}\n---\nx\n");
            let _ = doc(&plain);
        }
    }
}
