//! A compose file in `environment/` (`docker-compose.yaml`, Harbor's name;
//! also `docker-compose.yml`, `compose.yaml`, `compose.yml`): Harbor runs
//! the task's container as the compose service `main`, with the task's
//! file laid over its own (which builds `environment/`). sifbox honours a
//! file of one service that is the task's own (named `main`, building
//! `environment/`'s Dockerfile, or running the task's image): its
//! `environment` (map or list), `working_dir`, `user`, `network_mode`
//! (`none`), and its limits (`cpus`, `mem_limit`, `deploy.resources.limits`)
//! where the task file gives none. Other services, and what one sandbox
//! cannot be (a host path mounted, `privileged`, another container's
//! network, a command of its own), make the task `unsupported`; what
//! changes nothing the task can see (ports, restart policies, labels) is
//! a warning.

use std::path::{Path, PathBuf};

use serde_yaml_ng::{Mapping, Value};

use super::{bad, parse_memory, yaml, NetworkMode};
use crate::error::Result;
use crate::template;

/// The names looked for, in order (Harbor reads only the first).
pub const NAMES: &[&str] = &[
    "docker-compose.yaml",
    "docker-compose.yml",
    "compose.yaml",
    "compose.yml",
];

/// The largest compose file read.
const MAX_COMPOSE: u64 = 1 << 20;

/// What a compose file asks of the task's sandbox.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Compose {
    /// Env templates (`${VAR}` resolved from sifbox's environment, as
    /// compose interpolates from its own).
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub network: Option<NetworkMode>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    /// The service's `image` when it does not build: the task's image
    /// when the task names none.
    pub image: Option<String>,
    /// Whether the service builds `environment/`'s Dockerfile.
    pub builds: bool,
    /// `entrypoint` and `command`, as argvs (a string split into words as
    /// compose splits it).
    pub entrypoint: Option<Vec<String>>,
    pub command: Option<Vec<String>>,
    pub unsupported: Vec<String>,
    pub warnings: Vec<String>,
}

/// The compose file of the environment dir `env_dir`, the first of
/// [`NAMES`] there, and a warning when there are more.
pub fn find(env_dir: &Path) -> (Option<PathBuf>, Option<String>) {
    let found: Vec<PathBuf> = NAMES
        .iter()
        .map(|n| env_dir.join(n))
        .filter(|p| p.is_file())
        .collect();
    let warning = (found.len() > 1).then(|| {
        format!(
            "{}: several compose files; sifbox reads this one, as Harbor does (the others are ignored)",
            found[0].display()
        )
    });
    (found.into_iter().next(), warning)
}

/// Reads and parses the compose file at `path`; `task_image` is the
/// task's `docker_image`, if any.
pub fn load(path: &Path, task_image: Option<&str>) -> Result<Compose> {
    let file = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| {
        bad(
            &file,
            format!("cannot read it: {e}"),
            "make it a readable file",
        )
    })?;
    if !meta.is_file() || meta.len() > MAX_COMPOSE {
        return Err(bad(
            file,
            "not a regular file of at most 1 MiB",
            "make the compose file a small text file",
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        bad(
            &file,
            format!("cannot read it as UTF-8 text: {e}"),
            "make the compose file a UTF-8 text file",
        )
    })?;
    parse(&text, &file, task_image)
}

/// Parses a compose file's text; `file` names it in errors and notes.
pub fn parse(text: &str, file: &str, task_image: Option<&str>) -> Result<Compose> {
    let root = match yaml::parse(text, 1) {
        Ok(Value::Mapping(m)) => m,
        Ok(Value::Null) => Mapping::new(),
        Ok(other) => {
            return Err(bad(
                format!("{file}:1"),
                format!("the compose file is {}, not a mapping", yaml::kind(&other)),
                "write it as compose does: services: {main: {...}}",
            ))
        }
        Err((line, msg)) => {
            return Err(bad(
                format!("{file}:{line}"),
                format!("not a valid compose file: {msg}"),
                "fix the YAML",
            ))
        }
    };
    let mut c = Compose::default();
    let services = match root.get("services") {
        None | Some(Value::Null) => Mapping::new(),
        Some(Value::Mapping(m)) => m.clone(),
        Some(other) => {
            return Err(bad(
                format!("{file}:{}", yaml::line_of(text, 1, "services")),
                format!("services is {}, not a mapping", yaml::kind(other)),
                "write services: {main: {...}}",
            ))
        }
    };
    let names: Vec<String> = services.keys().filter_map(yaml::key_str).collect();
    if services.len() > 1 {
        c.unsupported.push(format!(
            "{file}: multi-service compose (services {}): sifbox runs the task in one sandbox and starts no other services",
            names.join(", ")
        ));
        return Ok(c);
    }
    let Some((name, service)) = services.into_iter().next() else {
        return Ok(c);
    };
    let name = yaml::key_str(&name).unwrap_or_default();
    let s = match service {
        Value::Mapping(m) => m,
        Value::Null => Mapping::new(),
        other => {
            return Err(bad(
                format!(
                    "{file}:{}",
                    yaml::line_of(text, 1, &format!("services.{name}"))
                ),
                format!("service {name} is {}, not a mapping", yaml::kind(&other)),
                "write the service's keys below its name",
            ))
        }
    };
    let mut svc = Service {
        c,
        file,
        name: &name,
        text,
    };
    svc.read(&s, task_image)?;
    Ok(svc.c)
}

/// Reading one service.
struct Service<'a> {
    c: Compose,
    file: &'a str,
    name: &'a str,
    text: &'a str,
}

/// Keys that change nothing a task in one sandbox can see, or that
/// Harbor's runs do not act on either.
const IGNORED: &[(&str, &str)] = &[
    (
        "ports",
        "the sandbox shares the host's network or has its own loopback; nothing is published",
    ),
    ("expose", "nothing is published"),
    ("container_name", "sandboxes are named by sifbox"),
    ("hostname", "the sandbox's host name is sifbox's"),
    ("restart", "a rollout's sandbox is not restarted"),
    ("labels", "labels are not kept"),
    ("depends_on", "there is one service"),
    (
        "healthcheck",
        "Harbor does not wait for it either; use [environment.healthcheck]",
    ),
    ("init", "the sandbox has its own init"),
    ("stdin_open", "commands get their own stdio"),
    ("tty", "commands get their own stdio"),
    ("pull_policy", "images are built or resolved by sifbox"),
    ("platform", "the host's platform is used"),
    ("logging", "output goes to the rollout's dir"),
    ("cap_add", "the sandbox's capabilities are sifbox's"),
    ("cap_drop", "the sandbox's capabilities are sifbox's"),
    ("security_opt", "the sandbox's seccomp policy is sifbox's"),
    (
        "memswap_limit",
        "swap follows Docker's rule (twice the memory)",
    ),
    ("mem_reservation", "reservations are not limits"),
    ("pids_limit", "the pids limit is the job's (--pids)"),
    ("shm_size", "/dev/shm is sifbox's"),
    ("ulimits", "the sandbox's rlimits are sifbox's"),
    ("extra_hosts", "/etc/hosts is the image's"),
    ("dns", "/etc/resolv.conf is the host's"),
    ("stop_signal", "sandboxes are stopped by sifbox"),
    ("stop_grace_period", "sandboxes are stopped by sifbox"),
    ("networks", "there is one service"),
];

impl Service<'_> {
    fn at(&self, key: &str) -> String {
        format!(
            "{}:{}",
            self.file,
            yaml::line_of(self.text, 1, &format!("services.{}.{key}", self.name))
        )
    }

    fn unsupported(&mut self, what: String) {
        let line = format!("{} service {}: {what}", self.file, self.name);
        self.c.unsupported.push(line);
    }

    fn warn(&mut self, key: &str, why: &str) {
        let line = format!(
            "{}: service {} {key} is not honoured by sifbox ({why}): ignored",
            self.at(key),
            self.name
        );
        self.c.warnings.push(line);
    }

    fn wrong(&self, key: &str, v: &Value, want: &str) -> crate::error::EvalError {
        bad(
            self.at(key),
            format!(
                "service {} {key} is {}, not {want}",
                self.name,
                yaml::kind(v)
            ),
            "fix the compose file (see the compose file reference)",
        )
    }

    fn read(&mut self, s: &Mapping, task_image: Option<&str>) -> Result<()> {
        let mut own = self.name == "main";
        for (k, v) in s {
            let Some(k) = yaml::key_str(k) else { continue };
            match k.as_str() {
                "build" => {
                    self.build(v)?;
                    own |= self.c.builds;
                }
                "image" => {
                    let Value::String(i) = v else {
                        return Err(self.wrong("image", v, "an image reference"));
                    };
                    // Harbor's name of the task's own image.
                    if !i.contains("MAIN_IMAGE_NAME") && !i.contains("PREBUILT_IMAGE_NAME") {
                        self.c.image = Some(i.trim().to_string());
                    }
                }
                "environment" => self.environment(v)?,
                "env_file" => self.unsupported(
                    "env_file: sifbox does not read env files; write the variables under environment".to_string(),
                ),
                "working_dir" => match v {
                    Value::String(w) if w.starts_with('/') && !w.contains('\0') && w.len() <= 4096 => {
                        self.c.workdir = Some(w.clone());
                    }
                    _ => {
                        return Err(bad(
                            self.at("working_dir"),
                            format!("service {} working_dir is not an absolute path", self.name),
                            "write an absolute path inside the container, e.g. /app",
                        ))
                    }
                },
                "user" => match v {
                    Value::String(u) if !u.is_empty() && u.len() <= 256 && !u.chars().any(char::is_control) => {
                        self.c.user = Some(u.clone());
                    }
                    Value::Number(n) if n.as_u64().is_some_and(|n| u32::try_from(n).is_ok()) => {
                        self.c.user = Some(n.to_string());
                    }
                    _ => return Err(self.wrong("user", v, "a user (NAME, UID or UID:GID)")),
                },
                "entrypoint" => self.c.entrypoint = Some(self.argv("entrypoint", v)?),
                "command" => self.c.command = Some(self.argv("command", v)?),
                "network_mode" => match v {
                    Value::String(m) if m == "none" => self.c.network = Some(NetworkMode::NoNetwork),
                    Value::String(m) if m == "host" || m == "bridge" || m == "default" => {
                        self.c.network = Some(NetworkMode::Public);
                    }
                    Value::String(m) => self.unsupported(format!(
                        "network_mode: {m:?}: sifbox runs no other containers to share a network with"
                    )),
                    _ => return Err(self.wrong("network_mode", v, "a network mode")),
                },
                "privileged" => {
                    if matches!(v, Value::Bool(true)) {
                        self.unsupported(
                            "privileged: true: sifbox sandboxes are never privileged".to_string(),
                        );
                    }
                }
                "volumes" => self.volumes(v)?,
                "tmpfs" => self.warn("tmpfs", "the sandbox's /tmp is the image's"),
                "devices" => self.unsupported(
                    "devices: sifbox passes no host devices into a sandbox".to_string(),
                ),
                // `${CPUS}`, `${MEMORY}`: Harbor's, the task file's limits.
                "cpus" | "mem_limit" if is_harbor_var(v) => {}
                "cpus" => self.c.cpus = Some(self.cpus("cpus", v)?),
                "mem_limit" => self.c.memory_mb = Some(self.memory("mem_limit", v)?),
                "deploy" => self.deploy(v)?,
                other => {
                    let why = IGNORED.iter().find(|(n, _)| *n == other).map(|(_, w)| *w);
                    if other.starts_with("x-") {
                        continue;
                    }
                    self.warn(other, why.unwrap_or("not a field sifbox knows"));
                }
            }
        }
        if let (Some(i), false) = (&self.c.image, self.c.builds) {
            match task_image {
                Some(t) if t != i => {
                    let line = format!(
                        "image {i:?}, not the task's own ({t:?}): a second container (multi-service compose), which sifbox does not run"
                    );
                    self.unsupported(line);
                    return Ok(());
                }
                _ => own = true,
            }
        }
        if !own {
            self.unsupported(
                "multi-service compose: the service is not the task's own (named main, building environment/ or running the task's image); sifbox starts no other services".to_string(),
            );
        }
        Ok(())
    }

    fn build(&mut self, v: &Value) -> Result<()> {
        let (context, dockerfile) = match v {
            Value::String(c) => (c.clone(), None),
            Value::Mapping(m) => {
                for (k, _) in m {
                    match yaml::key_str(k).as_deref() {
                        Some("context" | "dockerfile") => {}
                        Some(
                            k @ ("args"
                            | "target"
                            | "dockerfile_inline"
                            | "secrets"
                            | "ssh"
                            | "additional_contexts"),
                        ) => {
                            self.unsupported(format!(
                                "build.{k}: sifbox builds environment/Dockerfile as it is"
                            ));
                        }
                        Some(k) => {
                            let key = format!("build.{k}");
                            self.warn(&key, "the build is sifbox's");
                        }
                        None => {}
                    }
                }
                let s = |k: &str| match m.get(k) {
                    Some(Value::String(s)) => Some(s.clone()),
                    _ => None,
                };
                (s("context").unwrap_or_else(|| ".".into()), s("dockerfile"))
            }
            _ => return Err(self.wrong("build", v, "a context or a mapping")),
        };
        let here = matches!(
            context.trim().trim_end_matches('/'),
            "" | "." | "${CONTEXT_DIR}" | "$CONTEXT_DIR"
        );
        let dockerfile_ok = dockerfile
            .as_deref()
            .is_none_or(|d| matches!(d.trim_start_matches("./"), "Dockerfile"));
        if here && dockerfile_ok {
            self.c.builds = true;
        } else {
            self.unsupported(format!(
                "build: context {context:?}{}: sifbox builds environment/Dockerfile only",
                dockerfile
                    .map(|d| format!(", dockerfile {d:?}"))
                    .unwrap_or_default()
            ));
        }
        Ok(())
    }

    fn environment(&mut self, v: &Value) -> Result<()> {
        let mut entries: Vec<(String, Option<String>)> = Vec::new();
        match v {
            Value::Mapping(m) => {
                for (k, val) in m {
                    let Some(k) = yaml::key_str(k) else {
                        return Err(self.wrong("environment", k, "a variable name"));
                    };
                    let val = match val {
                        Value::Null => None,
                        Value::String(s) => Some(s.clone()),
                        Value::Number(n) => Some(n.to_string()),
                        Value::Bool(b) => Some(b.to_string()),
                        other => return Err(self.wrong("environment", other, "a string")),
                    };
                    entries.push((k, val));
                }
            }
            Value::Sequence(items) => {
                for item in items {
                    let Value::String(s) = item else {
                        return Err(self.wrong("environment", item, "NAME=VALUE"));
                    };
                    match s.split_once('=') {
                        Some((k, val)) => entries.push((k.to_string(), Some(val.to_string()))),
                        None => entries.push((s.clone(), None)),
                    }
                }
            }
            Value::Null => {}
            other => return Err(self.wrong("environment", other, "a mapping or a list")),
        }
        for (k, val) in entries {
            if !template::is_var_name(&k) {
                return Err(bad(
                    self.at("environment"),
                    format!(
                        "service {} environment: {k:?} is not a variable name",
                        self.name
                    ),
                    "use letters, digits and _ (not starting with a digit)",
                ));
            }
            // No value: compose passes its own environment's, if set.
            let val = val.unwrap_or_else(|| format!("${{{k}:-}}"));
            let val = braced(&val);
            if val.contains('\0') || template::check(&val).is_err() {
                self.unsupported(format!(
                    "environment {k}: compose interpolation that sifbox does not do ({val:?}); write ${{VAR}} or ${{VAR:-default}}"
                ));
                continue;
            }
            self.c.env.retain(|(e, _)| *e != k);
            self.c.env.push((k, val));
        }
        Ok(())
    }

    fn volumes(&mut self, v: &Value) -> Result<()> {
        let Value::Sequence(items) = v else {
            return Err(self.wrong("volumes", v, "a list"));
        };
        for item in items {
            let (source, target) = match item {
                Value::String(s) => {
                    let mut parts = s.splitn(3, ':');
                    match (parts.next(), parts.next()) {
                        (Some(t), None) => (None, t.to_string()),
                        (Some(src), Some(t)) => (Some(src.to_string()), t.to_string()),
                        _ => (None, s.clone()),
                    }
                }
                Value::Mapping(m) => {
                    let s = |k: &str| match m.get(k) {
                        Some(Value::String(s)) => Some(s.clone()),
                        _ => None,
                    };
                    let kind = s("type").unwrap_or_else(|| "volume".into());
                    let source = if kind == "bind" {
                        s("source").or_else(|| Some("/".into()))
                    } else {
                        s("source").filter(|_| kind == "volume")
                    };
                    (source, s("target").unwrap_or_default())
                }
                other => return Err(self.wrong("volumes", other, "a volume")),
            };
            let target = harbor_paths(&target);
            let t = target.trim_end_matches('/');
            if t == "/logs" || t.starts_with("/logs/") {
                self.warn(
                    "volumes",
                    &format!("{target}: sifbox binds the rollout's dir at /logs itself"),
                );
                continue;
            }
            match source {
                Some(src)
                    if src.starts_with('/')
                        || src.starts_with('.')
                        || src.starts_with('~')
                        || src.starts_with('$') =>
                {
                    self.unsupported(format!(
                        "volumes: {src}:{target}: sifbox mounts no host paths into a task's sandbox; COPY what the task needs in environment/Dockerfile"
                    ));
                }
                _ => self.warn(
                    "volumes",
                    &format!(
                        "{target}: a volume starts as the image's files, as they are without it"
                    ),
                ),
            }
        }
        Ok(())
    }

    /// `entrypoint`/`command`: a list of strings, a string (split into
    /// words, quotes removed), or null (none); interpolated as compose
    /// does (`$$` is `$`, `${VAR}` empty when unset), except that no
    /// variable of the caller's is set here: a suite is untrusted, and a
    /// command line is no place for what `--pass-env` passes (env values
    /// are).
    fn argv(&self, key: &str, v: &Value) -> Result<Vec<String>> {
        let words = self.words(key, v)?;
        let lookup = |_: &str| None;
        words
            .iter()
            .map(|w| {
                template::resolve(&braced(w), &lookup).map_err(|why| {
                    bad(
                        self.at(key),
                        format!("service {} {key}: {why}", self.name),
                        "write ${VAR}, ${VAR:-default}, or $$ for a literal $",
                    )
                })
            })
            .collect()
    }

    fn words(&self, key: &str, v: &Value) -> Result<Vec<String>> {
        match v {
            Value::Null => Ok(Vec::new()),
            Value::String(s) if !s.contains('\0') => Ok(split_words(s)),
            Value::Sequence(items) => items
                .iter()
                .map(|i| match i {
                    Value::String(s) if !s.contains('\0') => Ok(s.clone()),
                    Value::Number(n) => Ok(n.to_string()),
                    other => Err(self.wrong(key, other, "a string")),
                })
                .collect(),
            other => Err(self.wrong(key, other, "a command (a string or a list)")),
        }
    }

    fn cpus(&self, key: &str, v: &Value) -> Result<f64> {
        let n = match v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        match n {
            Some(n) if super::cpus_milli(n).is_some() => Ok(n),
            _ => Err(self.wrong(key, v, "a number of CPUs above 0")),
        }
    }

    fn memory(&self, key: &str, v: &Value) -> Result<u64> {
        let mb = match v {
            Value::Number(n) => n.as_u64().and_then(|b| parse_memory(&b.to_string())),
            // Compose's units: b, k/kb, m/mb, g/gb.
            Value::String(s) => {
                let lower = s.trim().to_ascii_lowercase();
                let unit = lower
                    .strip_suffix('b')
                    .filter(|r| r.ends_with(['k', 'm', 'g', 't']))
                    .unwrap_or(lower.as_str());
                parse_memory(unit.strip_suffix('b').unwrap_or(unit))
            }
            _ => None,
        };
        match mb {
            Some(m) if m > 0 && m <= super::MAX_MB => Ok(m),
            _ => Err(self.wrong(key, v, "a memory size (e.g. 512m, 2g)")),
        }
    }

    fn deploy(&mut self, v: &Value) -> Result<()> {
        let Value::Mapping(d) = v else {
            return Err(self.wrong("deploy", v, "a mapping"));
        };
        for (k, val) in d {
            match yaml::key_str(k).as_deref() {
                Some("resources") => {
                    let Value::Mapping(r) = val else {
                        return Err(self.wrong("deploy", val, "a mapping"));
                    };
                    for (rk, rv) in r {
                        match yaml::key_str(rk).as_deref() {
                            Some("limits") => {
                                let Value::Mapping(l) = rv else {
                                    return Err(self.wrong("deploy", rv, "a mapping"));
                                };
                                for (lk, lv) in l {
                                    match yaml::key_str(lk).as_deref() {
                                        _ if is_harbor_var(lv) => {}
                                        Some("cpus") => {
                                            self.c.cpus = Some(self.cpus("deploy", lv)?)
                                        }
                                        Some("memory") => {
                                            self.c.memory_mb = Some(self.memory("deploy", lv)?);
                                        }
                                        Some(other) => {
                                            let key = format!("deploy.resources.limits.{other}");
                                            self.warn(&key, "not a limit sifbox sets");
                                        }
                                        None => {}
                                    }
                                }
                            }
                            Some(other) => {
                                let key = format!("deploy.resources.{other}");
                                self.warn(&key, "reservations are not limits");
                            }
                            None => {}
                        }
                    }
                }
                Some(other) => {
                    let key = format!("deploy.{other}");
                    self.warn(&key, "there is one sandbox");
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// Whether a value is one of Harbor's own compose variables (`${CPUS}`):
/// a string with a `$` where a number belongs.
fn is_harbor_var(v: &Value) -> bool {
    matches!(v, Value::String(s) if s.contains('$'))
}

/// Harbor's variables of its old log mounts (`${ENV_VERIFIER_LOGS_PATH}`)
/// as the sandbox has them.
fn harbor_paths(s: &str) -> String {
    let mut out = s.to_string();
    for (var, path) in [
        ("ENV_VERIFIER_LOGS_PATH", "/logs/verifier"),
        ("ENV_AGENT_LOGS_PATH", "/logs/agent"),
        ("ENV_ARTIFACTS_PATH", "/logs/artifacts"),
    ] {
        out = out.replace(&format!("${{{var}}}"), path);
    }
    out
}

/// Compose's interpolation in sifbox's templates: `$NAME` and `${NAME}`
/// are `${NAME-}` (compose gives an unset variable as empty, with a
/// warning, where sifbox's `${NAME}` refuses the job); `$$` stays, and
/// `${NAME:-d}`, `${NAME-d}` are the same in both.
fn braced(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push_str("$$");
                i += 2;
                continue;
            }
            let name_at = i + 1 + usize::from(b[i + 1] == b'{');
            let end = (name_at..b.len())
                .find(|&j| !(b[j] == b'_' || b[j].is_ascii_alphanumeric()))
                .unwrap_or(b.len());
            let named = end > name_at && !b[name_at].is_ascii_digit();
            let braces = name_at > i + 1;
            if named && (!braces || b.get(end) == Some(&b'}')) {
                out.push_str("${");
                out.push_str(&s[name_at..end]);
                out.push_str("-}");
                i = end + usize::from(braces);
                continue;
            }
        }
        let ch = s[i..].chars().next().unwrap_or('\0');
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

/// Splits a command string into words as compose does (shell-like:
/// whitespace, single and double quotes, backslash escapes; no
/// expansion).
fn split_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                word.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some(n @ ('"' | '\\' | '$' | '`')) => word.push(n),
                            Some(n) => {
                                word.push('\\');
                                word.push(n);
                            }
                            None => {}
                        },
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Whether an argv only keeps the container alive (what Harbor's own
/// compose file runs in `main`): the sandbox stays up without it.
pub fn keep_alive(argv: &[String]) -> bool {
    let joined = argv.join(" ");
    let core = ["sh -c ", "bash -c ", "/bin/sh -c ", "/bin/bash -c "]
        .iter()
        .find_map(|p| joined.strip_prefix(p))
        .unwrap_or(&joined);
    matches!(
        core.trim(),
        "" | "sleep infinity" | "sleep inf" | "tail -f /dev/null" | "exec sleep infinity"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Result<Compose> {
        parse(s, "t/environment/docker-compose.yaml", None)
    }

    #[test]
    fn one_service_of_the_task() {
        let x = c("services:\n  main:\n    build: .\n    environment:\n      GREETING: hi\n      N: 3\n      FROM_HOST:\n      REF: $HOME/x\n    working_dir: /work\n    user: \"1000:1000\"\n    ports: [\"8080:80\"]\n    command: [\"sh\", \"-c\", \"sleep infinity\"]\n    mem_limit: 512m\n    deploy:\n      resources:\n        limits: {cpus: \"0.5\"}\n")
            .expect("valid");
        assert!(x.unsupported.is_empty(), "{:?}", x.unsupported);
        assert!(x.builds);
        assert_eq!(
            x.env,
            [
                ("GREETING".to_string(), "hi".to_string()),
                ("N".into(), "3".into()),
                ("FROM_HOST".into(), "${FROM_HOST:-}".into()),
                ("REF".into(), "${HOME-}/x".into()),
            ]
        );
        assert_eq!(x.workdir.as_deref(), Some("/work"));
        assert_eq!(x.user.as_deref(), Some("1000:1000"));
        assert_eq!((x.cpus, x.memory_mb), (Some(0.5), Some(512)));
        assert_eq!(x.warnings.len(), 1, "ports: {:?}", x.warnings);
        assert!(
            x.warnings[0].contains("docker-compose.yaml:11"),
            "{:?}",
            x.warnings
        );
        // The list form, another name building environment/, a volume for
        // /logs (Harbor's old log mounts), no network.
        let x = c("services:\n  app:\n    build:\n      context: ./\n      dockerfile: Dockerfile\n    environment: [\"A=1\", \"B=x=y\"]\n    network_mode: none\n    volumes: [\"${HOST_VERIFIER_LOGS_PATH}:/logs/verifier\"]\n")
            .expect("valid");
        assert!(x.unsupported.is_empty(), "{:?}", x.unsupported);
        assert_eq!(
            x.env,
            [
                ("A".to_string(), "1".to_string()),
                ("B".into(), "x=y".into())
            ]
        );
        assert_eq!(x.network, Some(NetworkMode::NoNetwork));
        // What Harbor's own tools write (its Terminal-Bench mapper): its
        // variables for the task's image, context and limits, and its old
        // log mounts.
        let x = c("services:\n  main:\n    build:\n      context: ${CONTEXT_DIR}\n    image: ${MAIN_IMAGE_NAME}\n    command: [\"sh\", \"-c\", \"sleep infinity\"]\n    environment: [\"TEST_DIR=${TEST_DIR}\"]\n    volumes: [\"${HOST_VERIFIER_LOGS_PATH}:${ENV_VERIFIER_LOGS_PATH}\"]\n    deploy:\n      resources:\n        limits: {cpus: \"${CPUS}\", memory: \"${MEMORY}\"}\n")
            .expect("Harbor's");
        assert!(x.unsupported.is_empty(), "{:?}", x.unsupported);
        assert_eq!(
            x.env,
            [("TEST_DIR".to_string(), "${TEST_DIR-}".to_string())]
        );
        assert_eq!((x.image, x.cpus, x.memory_mb), (None, None, None));
        // The task's image, without a build.
        let x = parse(
            "services:\n  main:\n    image: busybox\n",
            "f",
            Some("busybox"),
        )
        .expect("own image");
        assert!(x.unsupported.is_empty(), "{:?}", x.unsupported);
    }

    #[test]
    fn what_one_sandbox_cannot_be() {
        for (text, needle) in [
            (
                "services:\n  main:\n    build: .\n  db:\n    image: postgres\n",
                "multi-service compose (services main, db)",
            ),
            (
                "services:\n  db:\n    image: postgres\n",
                "multi-service compose",
            ),
            (
                "services:\n  main:\n    image: postgres\n",
                "not the task's own",
            ),
            (
                "services:\n  main:\n    build: .\n    privileged: true\n",
                "privileged",
            ),
            (
                "services:\n  main:\n    build: .\n    volumes: [\"/srv/data:/data\"]\n",
                "host paths",
            ),
            (
                "services:\n  main:\n    build: .\n    network_mode: \"service:db\"\n",
                "network_mode",
            ),
            ("services:\n  main:\n    build: ./other\n", "context"),
            (
                "services:\n  main:\n    build: {context: ., args: {A: 1}}\n",
                "build.args",
            ),
        ] {
            let x = parse(text, "f", Some("busybox")).expect(text);
            assert!(
                x.unsupported.iter().any(|u| u.contains(needle)),
                "{text:?}: {:?}",
                x.unsupported
            );
        }
        for (text, needle) in [
            ("services: [a]\n", "not a mapping"),
            ("services:\n  main:\n    working_dir: rel\n", ":3"),
            ("services:\n  main:\n    mem_limit: lots\n", "memory size"),
            ("services:\n  main:\n    cpus: 0\n", "CPUs"),
            (
                "services:\n  main:\n    environment: {\"1A\": x}\n",
                "variable name",
            ),
            ("services:\n  main: [\n", "not a valid compose file"),
        ] {
            let e = c(text).expect_err(text).to_string();
            assert!(
                e.contains(needle) && e.contains("docker-compose.yaml"),
                "{text:?}: {e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn service_commands() {
        let x = c("services:\n  main:\n    build: .\n    entrypoint: /start.sh\n    command: [\"sleep\", \"infinity\"]\n")
            .expect("valid");
        // Interpolated as compose does.
        let y = c("services:\n  main:\n    command: sh -c 'echo $$(id -u) ${SIFBOX_NO_SUCH_VAR}.${SIFBOX_NO_SUCH_VAR:-d}'\n")
            .expect("valid");
        assert_eq!(
            y.command.expect("command"),
            ["sh", "-c", "echo $(id -u) .d"]
        );
        assert!(x.unsupported.is_empty(), "{:?}", x.unsupported);
        let cmd = |e: Option<&[&str]>, c: Option<&[&str]>, image: Option<&[String]>| {
            super::super::ServiceCommand {
                entrypoint: e.map(|v| v.iter().map(|s| s.to_string()).collect()),
                command: c.map(|v| v.iter().map(|s| s.to_string()).collect()),
            }
            .argv(image)
        };
        let image = ["/entry".to_string()];
        // An entrypoint of the service replaces the image's, with the
        // command after it (a keep-alive command too).
        assert_eq!(
            cmd(
                Some(&["/start.sh"]),
                Some(&["sleep", "infinity"]),
                Some(&image)
            ),
            Some(vec![
                "/start.sh".to_string(),
                "sleep".into(),
                "infinity".into()
            ])
        );
        assert_eq!(
            x.entrypoint.as_deref(),
            Some(&["/start.sh".to_string()][..])
        );
        // A command alone follows the image's entrypoint; a keep-alive
        // command alone runs nothing.
        assert_eq!(
            cmd(None, Some(&["nginx"]), Some(&image)),
            Some(vec!["/entry".to_string(), "nginx".into()])
        );
        assert_eq!(
            cmd(None, Some(&["sh", "-c", "sleep infinity"]), Some(&image)),
            None
        );
        assert_eq!(
            cmd(Some(&[]), Some(&["nginx"]), Some(&image)),
            Some(vec!["nginx".to_string()])
        );
        assert_eq!(cmd(Some(&[]), None, Some(&image)), None);
    }

    #[test]
    fn keep_alive_commands() {
        let w = |s: &str| split_words(s);
        assert!(keep_alive(&w("sh -c 'sleep infinity'")));
        assert!(keep_alive(&w("tail -f /dev/null")));
        assert!(keep_alive(&[]));
        assert!(!keep_alive(&w("nginx -g 'daemon off;'")));
        assert_eq!(
            w(r#"a "b c" 'd "e"' f\ g "h\"i" """#),
            ["a", "b c", "d \"e\"", "f g", "h\"i", ""]
        );
        assert_eq!(braced("a$B$$c${D}$"), "a${B-}$$c${D-}$");
        assert_eq!(braced("${A:-x}${B-y}$1"), "${A:-x}${B-y}$1");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any text: a result or an error, never a panic.
        #[test]
        fn any_text_never_panics(s in "\\PC{0,400}") {
            let _ = c(&s);
            let _ = c(&format!("services:\n  main:\n    {s}\n"));
        }

        /// A service with compose's keys and random values: never a panic;
        /// errors are one line naming the file.
        #[test]
        fn compose_shaped_text(
            k in proptest::sample::select(vec!["build", "image", "environment", "working_dir", "user", "command", "entrypoint", "network_mode", "privileged", "volumes", "cpus", "mem_limit", "deploy", "ports", "env_file", "x-y", "devices"]),
            v in proptest::sample::select(vec!["1", "-1", "~", "[]", "{}", "[~]", "x", ".", "/abs", "\"${\"", "none", "1e400", "18446744073709551616", "{A: 1}", "[\"A=1\", B]", "{resources: {limits: {cpus: x, memory: 1g}}}", "[\"/a:/b\", {type: bind}]", "true", "{context: ., args: [a]}", "&a [*a]", "\"$$A$\""]),
            second in proptest::bool::ANY,
        ) {
            let more = if second { "  db:\n    image: x\n" } else { "" };
            let text = format!("services:\n  main:\n    {k}: {v}\n{more}");
            if let Err(e) = c(&text) {
                let e = e.to_string();
                proptest::prop_assert!(e.contains("docker-compose.yaml"), "{}", e);
                proptest::prop_assert!(!e.contains('\n'), "{}", e);
            }
        }
    }
}
