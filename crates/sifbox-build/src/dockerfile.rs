//! Dockerfile parsing into a typed model, with Docker's rules: parser
//! directives at the very top, comments, line continuations (comment and
//! empty lines inside one are dropped), case-insensitive keywords,
//! `--flag=value` before the arguments, JSON (exec) or shell form,
//! heredocs for RUN/COPY/ADD.
//!
//! Values that Docker substitutes variables in are kept raw here (quotes
//! included); [`crate::plan::StageEnv::expand_instruction`] expands them
//! with the right environment at the right time.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::lex::{split_whitespace, split_words};

/// A Dockerfile error: where, which instruction, what, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerfileError {
    /// The file name shown in messages (`Dockerfile` unless set).
    pub file: String,
    /// 1-based line of the instruction (0: not tied to a line).
    pub line: usize,
    /// The instruction's keyword in upper case, or empty.
    pub instruction: String,
    /// What is wrong.
    pub message: String,
    /// What to do about it, when there is something to say.
    pub hint: Option<String>,
}

impl DockerfileError {
    pub(crate) fn new(line: usize, instruction: &str, message: impl Into<String>) -> Self {
        DockerfileError {
            file: "Dockerfile".to_owned(),
            line,
            instruction: instruction.to_ascii_uppercase(),
            message: message.into(),
            hint: None,
        }
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The same error reported against `file` (the `-f` path as the user
    /// gave it).
    #[must_use]
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = file.into();
        self
    }
}

impl fmt::Display for DockerfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if !self.instruction.is_empty() {
            write!(f, ": {}", self.instruction)?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(h) = &self.hint {
            write!(f, "; {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DockerfileError {}

type Result<T> = std::result::Result<T, DockerfileError>;

/// Parser directives found at the top of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Directives {
    /// `# syntax=`: recorded, not acted on.
    pub syntax: Option<String>,
    /// `# escape=`: `\` (default) or `` ` ``.
    pub escape: char,
    /// `# check=`: recorded, not acted on.
    pub check: Option<String>,
}

impl Default for Directives {
    fn default() -> Self {
        Directives {
            syntax: None,
            escape: '\\',
            check: None,
        }
    }
}

/// A parsed Dockerfile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dockerfile {
    /// The parser directives.
    pub directives: Directives,
    /// `ARG`s before the first `FROM` (the global scope).
    pub args_before_from: Vec<Arg>,
    /// The stages, in file order (at least one).
    pub stages: Vec<Stage>,
}

/// One `ARG` declaration: `NAME` or `NAME=default` (default kept raw).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgDecl {
    /// The name.
    pub name: String,
    /// The default, raw (variables are expanded when the ARG is reached).
    pub default: Option<String>,
}

/// A global `ARG` instruction (several declarations possible).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Arg {
    /// 1-based line.
    pub line: usize,
    /// The declarations, in order.
    pub decls: Vec<ArgDecl>,
}

/// A build stage: its `FROM` and the instructions after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stage {
    /// 0-based position in the file.
    pub index: usize,
    /// The `AS` name, lower-cased as Docker does.
    pub name: Option<String>,
    /// The `FROM` instruction's line.
    pub line: usize,
    /// The `FROM` instruction's text.
    pub original: String,
    /// The `FROM` arguments.
    pub from: From,
    /// Everything after `FROM` up to the next `FROM`.
    pub instructions: Vec<Instruction>,
}

impl Stage {
    /// `stage N` or the stage's name, for messages.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => format!("stage {}", self.index),
        }
    }
}

/// `FROM [--platform=P] IMAGE [AS NAME]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct From {
    /// The image reference, raw (global ARGs are expanded in it).
    pub image: String,
    /// `--platform`, raw.
    pub platform: Option<String>,
    /// The stage name, lower-cased.
    pub name: Option<String>,
}

/// One instruction with where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instruction {
    /// 1-based line where it starts.
    pub line: usize,
    /// 1-based line where it ends (heredoc bodies included).
    pub end_line: usize,
    /// The logical line (continuations joined, heredoc bodies left out),
    /// as written.
    pub original: String,
    /// What it is.
    pub kind: Instr,
}

impl Instruction {
    /// The keyword in upper case (`RUN`, `COPY`...).
    pub fn keyword(&self) -> &'static str {
        self.kind.keyword()
    }

    /// An error about this instruction.
    pub fn error(&self, message: impl Into<String>) -> DockerfileError {
        DockerfileError::new(self.line, self.keyword(), message)
    }
}

/// The typed instructions (all but FROM, which starts a [`Stage`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Instr {
    /// `ARG NAME[=default] ...`
    Arg(Vec<ArgDecl>),
    /// `ENV K=V ...` or `ENV K V`; keys and values raw.
    Env(Vec<KeyValue>),
    /// `LABEL K=V ...`; keys and values raw.
    Label(Vec<KeyValue>),
    /// `RUN`.
    Run(Run),
    /// `COPY`.
    Copy(Copy),
    /// `ADD` (same fields as COPY; `--checksum`, `--keep-git-dir` only here).
    Add(Copy),
    /// `WORKDIR PATH`, raw.
    Workdir(String),
    /// `USER NAME[:GROUP]`, raw.
    User(String),
    /// `CMD`.
    Cmd(Command),
    /// `ENTRYPOINT`.
    Entrypoint(Command),
    /// `SHELL ["exe", "arg"...]` (JSON form only).
    Shell(Vec<String>),
    /// `EXPOSE PORT[/PROTO] ...`, raw words.
    Expose(Vec<String>),
    /// `VOLUME`, raw paths.
    Volume(Vec<String>),
    /// `STOPSIGNAL SIG`, raw.
    StopSignal(String),
    /// `HEALTHCHECK`.
    Healthcheck(Healthcheck),
    /// `ONBUILD INSTRUCTION`: the trigger text (recorded in the image as
    /// is) and its parse, which is checked but never run in this build.
    Onbuild(Onbuild),
    /// `MAINTAINER NAME` (deprecated): Docker sets the image's `author`.
    Maintainer(String),
}

impl Instr {
    /// The keyword in upper case.
    pub fn keyword(&self) -> &'static str {
        match self {
            Instr::Arg(_) => "ARG",
            Instr::Env(_) => "ENV",
            Instr::Label(_) => "LABEL",
            Instr::Run(_) => "RUN",
            Instr::Copy(_) => "COPY",
            Instr::Add(_) => "ADD",
            Instr::Workdir(_) => "WORKDIR",
            Instr::User(_) => "USER",
            Instr::Cmd(_) => "CMD",
            Instr::Entrypoint(_) => "ENTRYPOINT",
            Instr::Shell(_) => "SHELL",
            Instr::Expose(_) => "EXPOSE",
            Instr::Volume(_) => "VOLUME",
            Instr::StopSignal(_) => "STOPSIGNAL",
            Instr::Healthcheck(_) => "HEALTHCHECK",
            Instr::Onbuild(_) => "ONBUILD",
            Instr::Maintainer(_) => "MAINTAINER",
        }
    }
}

/// A key and a value (ENV, LABEL), raw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
}

/// Exec (JSON) or shell form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Command {
    /// `["exe", "arg"]`: run as is.
    Exec(Vec<String>),
    /// Anything else: run by the stage's SHELL.
    Shell(String),
}

/// A heredoc: `<<NAME` and the lines up to `NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Heredoc {
    /// The delimiter, quotes removed.
    pub name: String,
    /// The body, each line ending in `\n`; for `<<-` leading tabs are
    /// already stripped from every line.
    pub content: String,
    /// False when the delimiter was quoted (`<<"EOF"`, `<<'EOF'`): the body
    /// is taken literally.
    pub expand: bool,
    /// `<<-`.
    pub chomp: bool,
    /// The file descriptor in `3<<EOF` (RUN), if any.
    pub fd: Option<u32>,
}

/// `RUN [--mount=...]... [--network=...] [--security=...] COMMAND`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    /// The `--mount` flags, in order.
    pub mounts: Vec<Mount>,
    /// `--network`.
    pub network: Option<Network>,
    /// `--security`.
    pub security: Option<Security>,
    /// The command.
    pub command: Command,
    /// Heredocs named in the command, in order. When the shell-form command
    /// is just `<<NAME` (one heredoc, nothing else), the body is the script;
    /// otherwise the shell reads the heredocs itself.
    pub heredocs: Vec<Heredoc>,
}

impl Run {
    /// The heredoc that is the whole script, when the shell-form command is
    /// just `<<NAME` (or `<<-NAME`, quoted or not): BuildKit then runs its
    /// body as the script (with the shell, or directly when it starts with
    /// `#!`). `None` when the shell must see the heredocs itself
    /// (`cat <<EOF > f`, `python3 <<EOF`), which it does when the body and
    /// the terminator are appended to the command.
    pub fn script_heredoc(&self) -> Option<&Heredoc> {
        let Command::Shell(cmd) = &self.command else {
            return None;
        };
        let words = split_words(cmd, '\\');
        match (words.as_slice(), self.heredocs.as_slice()) {
            ([w], [h]) if heredoc_mark(w).is_some_and(|m| m.name == h.name && m.fd.is_none()) => {
                Some(h)
            }
            _ => None,
        }
    }

    /// The shell-form command with its heredocs written out after it, as a
    /// shell reads them (`CMD <<EOF\nbody\nEOF\n`); the command as is when
    /// there are none or it is in exec form.
    pub fn shell_script_with_heredocs(&self) -> Option<String> {
        let Command::Shell(cmd) = &self.command else {
            return None;
        };
        let mut s = cmd.clone();
        for h in &self.heredocs {
            s.push('\n');
            s.push_str(&h.content);
            s.push_str(&h.name);
        }
        if !self.heredocs.is_empty() {
            s.push('\n');
        }
        Some(s)
    }
}

/// `RUN --network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Network {
    /// `default`.
    Default,
    /// `none`.
    None,
    /// `host`.
    Host,
}

/// `RUN --security`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Security {
    /// `sandbox` (the default).
    Sandbox,
    /// `insecure`.
    Insecure,
}

/// `RUN --mount` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MountType {
    /// `bind` (the default): a directory of the context or of `from`.
    Bind,
    /// `cache`: a persistent cache directory.
    Cache,
    /// `tmpfs`.
    Tmpfs,
    /// `secret`: a `--secret` file.
    Secret,
    /// `ssh`: an agent socket.
    Ssh,
}

/// `RUN --mount` sharing mode for caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Sharing {
    /// `shared` (the default).
    Shared,
    /// `private`: a new cache directory when one is in use.
    Private,
    /// `locked`: wait for the other user.
    Locked,
}

/// One `RUN --mount=...`. String fields are raw until
/// [`Mount::parse`] is called with an environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// The flag value as written.
    pub spec: String,
    /// `type=`.
    pub kind: MountType,
    /// `target=` / `dst=` / `destination=`.
    pub target: Option<String>,
    /// `source=` / `src=`.
    pub source: Option<String>,
    /// `from=`: a stage or an image.
    pub from: Option<String>,
    /// `id=`.
    pub id: Option<String>,
    /// `sharing=` (cache).
    pub sharing: Sharing,
    /// `mode=` in octal.
    pub mode: Option<u32>,
    /// `uid=`.
    pub uid: Option<u32>,
    /// `gid=`.
    pub gid: Option<u32>,
    /// `required` (secret, ssh).
    pub required: bool,
    /// `size=` in bytes (tmpfs).
    pub size: Option<u64>,
    /// Read-only: the default for bind, `ro`/`readonly` for the others;
    /// `rw`/`readwrite` clears it.
    pub readonly: bool,
    /// `env=` (secret): expose the secret as this variable.
    pub env: Option<String>,
}

impl Mount {
    /// The mount point, with Docker's defaults: `/run/secrets/ID` for a
    /// secret, `/run/buildkit/ssh_agent.0` for ssh.
    pub fn effective_target(&self) -> Option<String> {
        match (&self.target, self.kind) {
            (Some(t), _) => Some(t.clone()),
            (None, MountType::Secret) => self.id.as_ref().map(|id| format!("/run/secrets/{id}")),
            (None, MountType::Ssh) => Some("/run/buildkit/ssh_agent.0".to_owned()),
            (None, _) => None,
        }
    }

    /// The cache or secret id, with Docker's defaults: a cache's id is its
    /// target; a secret's id is the base name of its target.
    pub fn effective_id(&self) -> Option<String> {
        if let Some(id) = &self.id {
            return Some(id.clone());
        }
        match self.kind {
            MountType::Cache => self.target.clone(),
            MountType::Secret => self
                .target
                .as_deref()
                .and_then(|t| t.rsplit('/').find(|p| !p.is_empty()))
                .map(str::to_owned),
            MountType::Ssh => Some("default".to_owned()),
            _ => None,
        }
    }

    /// The mode, with Docker's defaults: 0755 for a cache directory, 0400
    /// for a secret file, 0600 for an ssh socket.
    pub fn effective_mode(&self) -> Option<u32> {
        self.mode.or(match self.kind {
            MountType::Cache => Some(0o755),
            MountType::Secret => Some(0o400),
            MountType::Ssh => Some(0o600),
            _ => None,
        })
    }

    /// Parses a `--mount` value, expanding each value with `expand`
    /// (pass `&|s| Ok(s.to_owned())` for none).
    pub fn parse(
        spec: &str,
        expand: &dyn Fn(&str) -> std::result::Result<String, String>,
    ) -> std::result::Result<Mount, String> {
        let fields = split_csv(spec)?;
        let mut kind = MountType::Bind;
        let mut rest = Vec::new();
        for f in fields {
            let (k, v) = match f.split_once('=') {
                Some((k, v)) => (k.trim().to_ascii_lowercase(), Some(v.to_owned())),
                None => (f.trim().to_ascii_lowercase(), None),
            };
            if k == "type" {
                let v = v.ok_or("type needs a value (bind, cache, tmpfs, secret, ssh)")?;
                kind = match v.to_ascii_lowercase().as_str() {
                    "bind" => MountType::Bind,
                    "cache" => MountType::Cache,
                    "tmpfs" => MountType::Tmpfs,
                    "secret" => MountType::Secret,
                    "ssh" => MountType::Ssh,
                    other => {
                        return Err(format!(
                            "unsupported mount type {other:?} (bind, cache, tmpfs, secret, ssh)"
                        ))
                    }
                };
            } else {
                rest.push((k, v));
            }
        }
        let mut m = Mount {
            spec: spec.to_owned(),
            kind,
            target: None,
            source: None,
            from: None,
            id: None,
            sharing: Sharing::Shared,
            mode: None,
            uid: None,
            gid: None,
            required: false,
            size: None,
            readonly: kind == MountType::Bind,
            env: None,
        };
        for (k, v) in rest {
            let boolean = |v: &Option<String>| -> std::result::Result<bool, String> {
                match v.as_deref().map(str::to_ascii_lowercase).as_deref() {
                    None | Some("true") => Ok(true),
                    Some("false") => Ok(false),
                    Some(other) => Err(format!("{k}: expected true or false, got {other:?}")),
                }
            };
            if matches!(k.as_str(), "ro" | "readonly") {
                m.readonly = boolean(&v)?;
                continue;
            }
            if matches!(k.as_str(), "rw" | "readwrite") {
                m.readonly = !boolean(&v)?;
                continue;
            }
            if k == "required" {
                m.required = boolean(&v)?;
                continue;
            }
            let Some(raw) = v else {
                return Err(format!("mount option {k} needs a value ({k}=...)"));
            };
            let val = expand(&raw)?;
            match k.as_str() {
                "target" | "dst" | "destination" => m.target = Some(val),
                "source" | "src" => m.source = Some(val),
                "from" => m.from = Some(val),
                "id" => m.id = Some(val),
                "env" => m.env = Some(val),
                "sharing" => {
                    m.sharing = match val.as_str() {
                        "shared" => Sharing::Shared,
                        "private" => Sharing::Private,
                        "locked" => Sharing::Locked,
                        other => {
                            return Err(format!(
                                "unsupported sharing value {other:?} (shared, private, locked)"
                            ))
                        }
                    }
                }
                "mode" => {
                    m.mode = Some(
                        u32::from_str_radix(&val, 8)
                            .map_err(|_| format!("mode {val:?} is not an octal number"))?,
                    )
                }
                "uid" => {
                    m.uid = Some(
                        val.parse()
                            .map_err(|_| format!("uid {val:?} is not a number"))?,
                    )
                }
                "gid" => {
                    m.gid = Some(
                        val.parse()
                            .map_err(|_| format!("gid {val:?} is not a number"))?,
                    )
                }
                "size" => m.size = Some(parse_size(&val)?),
                other => return Err(format!("unexpected mount option {other:?}")),
            }
        }
        if m.target.is_none() && !matches!(m.kind, MountType::Secret | MountType::Ssh) {
            return Err("mount needs a target (target=/path)".to_owned());
        }
        if m.kind == MountType::Secret && m.id.is_none() && m.target.is_none() {
            return Err("secret mount needs id= or target=".to_owned());
        }
        Ok(m)
    }
}

/// Sizes as in `size=64m`: bytes, or with a k/m/g/t suffix (powers of 1024,
/// an optional trailing `b`/`ib`).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let t = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'm')) => (&t[..i], 1 << 20),
        Some((i, 'g')) => (&t[..i], 1 << 30),
        Some((i, 't')) => (&t[..i], 1 << 40),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("size {s:?} is not a size (e.g. 64m)"))
}

/// Splits `a=1,"b=x,y",c` into fields (CSV: double quotes group, `""` is a
/// quote inside quotes).
fn split_csv(s: &str) -> std::result::Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    cur.push('"');
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' {
            quoted = true;
        } else if c == ',' {
            fields.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if quoted {
        return Err(format!("unclosed quote in {s:?}"));
    }
    fields.push(cur);
    Ok(fields
        .into_iter()
        .filter(|f| !f.trim().is_empty())
        .collect())
}

/// A COPY or ADD source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Source {
    /// A path (glob) in the context or in `--from`, or for ADD a URL; raw.
    Path(String),
    /// A heredoc: a file made of its body.
    Heredoc(Heredoc),
}

/// `COPY`/`ADD` flags and arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Copy {
    /// `--from=` (COPY only), raw.
    pub from: Option<String>,
    /// `--chown=`, raw.
    pub chown: Option<String>,
    /// `--chmod=`, raw.
    pub chmod: Option<String>,
    /// `--link`.
    pub link: bool,
    /// `--parents`.
    pub parents: bool,
    /// `--exclude=`, raw patterns.
    pub exclude: Vec<String>,
    /// `--checksum=` (ADD only), raw.
    pub checksum: Option<String>,
    /// `--keep-git-dir` (ADD only).
    pub keep_git_dir: bool,
    /// The sources (at least one).
    pub sources: Vec<Source>,
    /// The destination, raw.
    pub dest: String,
    /// Whether the arguments were written as a JSON array.
    pub json: bool,
}

/// `HEALTHCHECK`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Healthcheck {
    /// `HEALTHCHECK NONE`: disable the base image's.
    None,
    /// `HEALTHCHECK [flags] CMD ...`.
    Cmd {
        /// The test: exec form is Docker's `["CMD", ...]`, shell form
        /// `["CMD-SHELL", "..."]`.
        command: Command,
        /// `--interval`.
        interval: Option<Duration>,
        /// `--timeout`.
        timeout: Option<Duration>,
        /// `--start-period`.
        start_period: Option<Duration>,
        /// `--start-interval`.
        start_interval: Option<Duration>,
        /// `--retries`.
        retries: Option<u32>,
    },
}

/// `ONBUILD`: the trigger as recorded in the image and its parse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Onbuild {
    /// The text after `ONBUILD`, as written.
    pub expression: String,
    /// The trigger, parsed (for checking only).
    pub instruction: Box<Instruction>,
}

/// The instruction keywords Docker knows.
const KEYWORDS: &[&str] = &[
    "add",
    "arg",
    "cmd",
    "copy",
    "entrypoint",
    "env",
    "expose",
    "from",
    "healthcheck",
    "label",
    "maintainer",
    "onbuild",
    "run",
    "shell",
    "stopsignal",
    "user",
    "volume",
    "workdir",
];

/// Parses an ONBUILD trigger found in a base image's config (the text
/// after `ONBUILD`), to run it right after the FROM that uses that image.
/// Errors cite `line` (the FROM's).
pub fn parse_trigger(expression: &str, escape: char, line: usize) -> Result<Instruction> {
    let directive = if escape == '`' { "# escape=`\n" } else { "" };
    let src = format!("{directive}FROM scratch\n{expression}\n");
    let at = |mut e: DockerfileError| {
        e.line = line;
        e.message = format!("ONBUILD trigger {expression:?}: {}", e.message);
        e
    };
    let df = parse_str(&src).map_err(at)?;
    let mut stages = df.stages;
    let inst = match stages.pop() {
        Some(st) if stages.is_empty() && st.instructions.len() == 1 => {
            st.instructions.into_iter().next()
        }
        _ => None,
    };
    let Some(mut inst) = inst else {
        return Err(DockerfileError::new(
            line,
            "ONBUILD",
            format!("trigger {expression:?} is not one instruction"),
        ));
    };
    if matches!(inst.kind, Instr::Onbuild(_) | Instr::Maintainer(_)) {
        return Err(DockerfileError::new(
            line,
            "ONBUILD",
            format!("{} isn't allowed as an ONBUILD trigger", inst.keyword()),
        ));
    }
    inst.line = line;
    inst.end_line = line;
    Ok(inst)
}

/// Parses a Dockerfile (bytes that are not UTF-8 are replaced).
pub fn parse(src: &[u8]) -> Result<Dockerfile> {
    parse_str(&String::from_utf8_lossy(src))
}

/// Parses a Dockerfile.
pub fn parse_str(src: &str) -> Result<Dockerfile> {
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    let lines: Vec<&str> = src
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let (directives, first) = parse_directives(&lines)?;
    let escape = directives.escape;

    let mut args_before_from = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    let mut i = first;
    while i < lines.len() {
        let start = i;
        let trimmed = lines[i].trim_start();
        i += 1;
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        // Join continuation lines.
        let mut text = String::new();
        let mut cont = strip_continuation(trimmed, escape);
        match cont {
            Some(head) => text.push_str(head),
            None => text.push_str(trimmed),
        }
        while cont.is_some() && i < lines.len() {
            let l = lines[i];
            i += 1;
            let t = l.trim_start();
            if t.starts_with('#') || t.trim_end().is_empty() {
                continue;
            }
            cont = strip_continuation(l, escape);
            text.push_str(cont.unwrap_or(l));
        }
        let line = start + 1;
        let text = text.trim().to_owned();
        let (keyword, rest) = split_keyword(&text);
        let kw = keyword.to_ascii_lowercase();
        if !KEYWORDS.contains(&kw.as_str()) {
            return Err(unknown_instruction(line, keyword));
        }
        let (flags_words, args) =
            extract_flags(rest).map_err(|m| DockerfileError::new(line, &kw, m))?;
        let mut flags = Flags::new(flags_words, line, &kw)?;
        let heredocs = if matches!(kw.as_str(), "run" | "copy" | "add") {
            let marks = heredoc_marks(args);
            let mut docs = Vec::new();
            for mark in marks {
                let (content, next) = read_heredoc(&lines, i, &mark)
                    .map_err(|m| DockerfileError::new(line, &kw, m))?;
                i = next;
                docs.push(Heredoc {
                    name: mark.name,
                    content,
                    expand: mark.expand,
                    chomp: mark.chomp,
                    fd: mark.fd,
                });
            }
            docs
        } else {
            Vec::new()
        };
        let end_line = i.max(start + 1);

        if kw == "from" {
            let from = parse_from(&mut flags, args, line)?;
            if let Some(name) = &from.name {
                if stages.iter().any(|s| s.name.as_deref() == Some(name)) {
                    return Err(DockerfileError::new(
                        line,
                        "FROM",
                        format!("duplicate stage name {name:?}"),
                    )
                    .hint("give each stage its own AS name"));
                }
            }
            stages.push(Stage {
                index: stages.len(),
                name: from.name.clone(),
                line,
                original: text.clone(),
                from,
                instructions: Vec::new(),
            });
            continue;
        }
        let kind = parse_instruction(&kw, &mut flags, args, heredocs, line, escape)?;
        let inst = Instruction {
            line,
            end_line,
            original: text,
            kind,
        };
        match stages.last_mut() {
            Some(stage) => stage.instructions.push(inst),
            None => match inst.kind {
                Instr::Arg(decls) => args_before_from.push(Arg { line, decls }),
                _ => {
                    return Err(DockerfileError::new(
                        line,
                        &kw,
                        "no build stage in current context",
                    )
                    .hint("only ARG instructions may come before the first FROM"))
                }
            },
        }
    }
    if stages.is_empty() {
        return Err(
            DockerfileError::new(0, "", "the Dockerfile has no FROM instruction")
                .hint("start a stage with FROM IMAGE (or FROM scratch)"),
        );
    }
    Ok(Dockerfile {
        directives,
        args_before_from,
        stages,
    })
}

fn unknown_instruction(line: usize, keyword: &str) -> DockerfileError {
    let lower = keyword.to_ascii_lowercase();
    let close = KEYWORDS
        .iter()
        .copied()
        .filter(|k| edit_distance(k, &lower) <= 2)
        .min_by_key(|k| edit_distance(k, &lower));
    let err = DockerfileError::new(
        line,
        "",
        format!("unknown instruction: {}", keyword.to_ascii_uppercase()),
    );
    match close {
        Some(k) => err.hint(format!("did you mean {}?", k.to_ascii_uppercase())),
        None => err,
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Reads the directives; returns them and the index of the first line that
/// is not one.
fn parse_directives(lines: &[&str]) -> Result<(Directives, usize)> {
    let mut d = Directives::default();
    let mut seen: Vec<String> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some((key, value)) = directive(l.trim_start()) else {
            return Ok((d, i));
        };
        let key = key.to_ascii_lowercase();
        if !matches!(key.as_str(), "syntax" | "escape" | "check") {
            // An unknown directive is a comment, and ends the directives.
            return Ok((d, i));
        }
        if seen.contains(&key) {
            return Err(DockerfileError::new(
                i + 1,
                "",
                format!("only one {key} parser directive can be used"),
            ));
        }
        seen.push(key.clone());
        match key.as_str() {
            "syntax" => d.syntax = Some(value.to_owned()),
            "check" => d.check = Some(value.to_owned()),
            _ => {
                d.escape = match value {
                    "\\" => '\\',
                    "`" => '`',
                    other => {
                        return Err(DockerfileError::new(
                            i + 1,
                            "",
                            format!("invalid escape token {other:?}"),
                        )
                        .hint("use # escape=\\ or # escape=`"))
                    }
                }
            }
        }
    }
    Ok((d, lines.len()))
}

/// `#  key = value` → (key, value): a letter then letters/digits, `=`,
/// a non-empty value; whitespace around each part.
fn directive(l: &str) -> Option<(&str, &str)> {
    let rest = l.strip_prefix('#')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    let key = &rest[..end];
    if !key.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let value = rest[end..].trim_start().strip_prefix('=')?.trim();
    if value.is_empty() {
        return None;
    }
    Some((key, value))
}

/// When `l` ends with the escape character (then optional spaces/tabs),
/// the part before it.
fn strip_continuation(l: &str, escape: char) -> Option<&str> {
    l.trim_end_matches([' ', '\t']).strip_suffix(escape)
}

fn split_keyword(text: &str) -> (&str, &str) {
    match text.find(char::is_whitespace) {
        Some(i) => (&text[..i], text[i..].trim()),
        None => (text, ""),
    }
}

/// Takes the leading `--flag[=value]` words off `s` (quotes removed,
/// backslash escapes honoured; a lone `--` ends them). Returns the flags
/// and the rest.
fn extract_flags(s: &str) -> std::result::Result<(Vec<String>, &str), String> {
    let mut flags = Vec::new();
    let mut rest = s.trim_start();
    while rest.starts_with("--") {
        let chars: Vec<(usize, char)> = rest.char_indices().collect();
        let mut word = String::new();
        let mut quote: Option<char> = None;
        let mut k = 0;
        let mut end = rest.len();
        while k < chars.len() {
            let (pos, c) = chars[k];
            k += 1;
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) if c == '\\' => {
                    if let Some(&(_, n)) = chars.get(k) {
                        word.push(n);
                        k += 1;
                    }
                }
                Some(_) => word.push(c),
                None if c.is_whitespace() => {
                    end = pos;
                    break;
                }
                None if c == '"' || c == '\'' => quote = Some(c),
                None if c == '\\' => {
                    if let Some(&(_, n)) = chars.get(k) {
                        word.push(n);
                        k += 1;
                    }
                }
                None => word.push(c),
            }
        }
        if quote.is_some() {
            return Err(format!("unclosed quote in flag {word}"));
        }
        rest = rest[end..].trim_start();
        if word == "--" {
            break;
        }
        flags.push(word);
    }
    Ok((flags, rest))
}

/// The flags of one instruction, consumed by name.
struct Flags {
    items: Vec<(String, Option<String>)>,
    line: usize,
    kw: String,
}

impl Flags {
    fn new(words: Vec<String>, line: usize, kw: &str) -> Result<Self> {
        let mut items = Vec::new();
        for w in words {
            let body = &w[2..];
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (body.to_owned(), None),
            };
            if name.is_empty() {
                return Err(DockerfileError::new(line, kw, format!("bad flag {w:?}")));
            }
            items.push((name, value));
        }
        Ok(Flags {
            items,
            line,
            kw: kw.to_owned(),
        })
    }

    fn err(&self, m: impl Into<String>) -> DockerfileError {
        DockerfileError::new(self.line, &self.kw, m)
    }

    fn take(&mut self, name: &str) -> Vec<Option<String>> {
        let mut out = Vec::new();
        self.items.retain(|(n, v)| {
            if n == name {
                out.push(v.clone());
                false
            } else {
                true
            }
        });
        out
    }

    fn string(&mut self, name: &str) -> Result<Option<String>> {
        let vals = self.take(name);
        if vals.len() > 1 {
            return Err(self.err(format!("duplicate flag specified: --{name}")));
        }
        match vals.into_iter().next() {
            None => Ok(None),
            Some(None) => Err(self
                .err(format!("missing a value on flag: --{name}"))
                .hint(format!("write --{name}=VALUE"))),
            Some(Some(v)) => Ok(Some(v)),
        }
    }

    fn strings(&mut self, name: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for v in self.take(name) {
            match v {
                Some(v) => out.push(v),
                None => {
                    return Err(self
                        .err(format!("missing a value on flag: --{name}"))
                        .hint(format!("write --{name}=VALUE")))
                }
            }
        }
        Ok(out)
    }

    fn boolean(&mut self, name: &str) -> Result<bool> {
        let vals = self.take(name);
        if vals.len() > 1 {
            return Err(self.err(format!("duplicate flag specified: --{name}")));
        }
        match vals.into_iter().next() {
            None => Ok(false),
            Some(None) => Ok(true),
            Some(Some(v)) => match v.to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(self.err(format!(
                    "expecting boolean value for flag --{name}, not: {v}"
                ))),
            },
        }
    }

    /// Fails on any flag not consumed.
    fn finish(&self, allowed: &[&str]) -> Result<()> {
        if let Some((name, _)) = self.items.first() {
            let hint = if allowed.is_empty() {
                format!("{} takes no flags", self.kw.to_ascii_uppercase())
            } else {
                let list: Vec<String> = allowed.iter().map(|a| format!("--{a}")).collect();
                format!("allowed: {}", list.join(", "))
            };
            return Err(self.err(format!("unknown flag: --{name}")).hint(hint));
        }
        Ok(())
    }
}

/// A heredoc marker found in a line.
#[derive(Debug)]
struct Mark {
    name: String,
    expand: bool,
    chomp: bool,
    fd: Option<u32>,
    /// The word as written (`<<-"EOF"`).
    word: String,
}

/// The heredoc markers (`[N]<<[-]NAME`) among the shell words of `args`.
fn heredoc_marks(args: &str) -> Vec<Mark> {
    split_words(args, '\\')
        .into_iter()
        .filter_map(|w| heredoc_mark(&w))
        .collect()
}

fn heredoc_mark(word: &str) -> Option<Mark> {
    let digits = word.find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
    let rest = word[digits..].strip_prefix("<<")?;
    let (chomp, rest) = match rest.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    if rest.is_empty() || rest.contains('<') {
        return None;
    }
    let fd = if digits > 0 {
        Some(word[..digits].parse().ok()?)
    } else {
        None
    };
    // Quotes (or escapes) anywhere in the delimiter disable expansion.
    let quoted = rest.contains(['"', '\'', '\\']);
    let name = crate::lex::expand_word(rest, &(), '\\').ok()?;
    if name.is_empty() {
        return None;
    }
    Some(Mark {
        name,
        expand: !quoted,
        chomp,
        fd,
        word: word.to_owned(),
    })
}

/// Reads a heredoc body starting at `lines[i]`; returns it and the index
/// after the terminator.
fn read_heredoc(
    lines: &[&str],
    mut i: usize,
    mark: &Mark,
) -> std::result::Result<(String, usize), String> {
    let mut content = String::new();
    while i < lines.len() {
        let l = lines[i];
        i += 1;
        let body = if mark.chomp {
            l.trim_start_matches('\t')
        } else {
            l
        };
        if body == mark.name {
            return Ok((content, i));
        }
        content.push_str(body);
        content.push('\n');
    }
    Err(format!(
        "unterminated heredoc: no line {:?} closes {}",
        mark.name, mark.word
    ))
}

/// JSON array of strings, or `None`.
fn json_array(s: &str) -> Option<Vec<String>> {
    let t = s.trim();
    if !t.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(t).ok()
}

fn parse_command(args: &str) -> Command {
    match json_array(args) {
        Some(v) => Command::Exec(v),
        None => Command::Shell(args.to_owned()),
    }
}

fn parse_from(flags: &mut Flags, args: &str, line: usize) -> Result<From> {
    let platform = flags.string("platform")?;
    flags.finish(&["platform"])?;
    let words = split_whitespace(args);
    let err = |m: String| DockerfileError::new(line, "FROM", m);
    let (image, name) = match words.as_slice() {
        [image] => (image.clone(), None),
        [image, as_, name] if as_.eq_ignore_ascii_case("as") => {
            let name = name.to_ascii_lowercase();
            let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c));
            if !ok {
                return Err(err(format!("invalid name for build stage: {name:?}")).hint(
                    "a stage name starts with a letter and has only letters, digits, -, _ and .",
                ));
            }
            (image.clone(), Some(name))
        }
        [] => {
            return Err(err("FROM requires an image".into())
                .hint("write FROM IMAGE [AS NAME] (or FROM scratch)"))
        }
        _ => {
            return Err(err("FROM requires either one or three arguments".into())
                .hint("write FROM IMAGE [AS NAME]"))
        }
    };
    Ok(From {
        image,
        platform,
        name,
    })
}

fn parse_name_val(args: &str, kw: &str, line: usize, escape: char) -> Result<Vec<KeyValue>> {
    let err = |m: String| DockerfileError::new(line, kw, m);
    let words = split_words(args, escape);
    let Some(first) = words.first() else {
        return Err(err(format!(
            "{} requires at least one argument",
            kw.to_uppercase()
        ))
        .hint("write KEY=VALUE"));
    };
    if !first.contains('=') {
        // The legacy form `KEY VALUE...`: the value is the rest, as written.
        let Some((key, value)) = args.split_once(char::is_whitespace) else {
            return Err(
                err(format!("{} must have two arguments", kw.to_uppercase()))
                    .hint("write KEY=VALUE"),
            );
        };
        return Ok(vec![KeyValue {
            key: key.to_owned(),
            value: value.trim_start().to_owned(),
        }]);
    }
    let mut out = Vec::new();
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            return Err(err(format!(
                "syntax error - can't find = in {w:?}. Must be of the form: name=value"
            )));
        };
        if k.is_empty() {
            return Err(err(format!(
                "{} names can not be blank",
                kw.to_ascii_uppercase()
            )));
        }
        out.push(KeyValue {
            key: k.to_owned(),
            value: v.to_owned(),
        });
    }
    Ok(out)
}

fn parse_arg(args: &str, line: usize, escape: char) -> Result<Vec<ArgDecl>> {
    let words = split_words(args, escape);
    if words.is_empty() {
        return Err(
            DockerfileError::new(line, "ARG", "ARG requires at least one argument")
                .hint("write ARG NAME or ARG NAME=DEFAULT"),
        );
    }
    let mut out = Vec::new();
    for w in words {
        let (name, default) = match w.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (w, None),
        };
        if name.is_empty() {
            return Err(DockerfileError::new(
                line,
                "ARG",
                "ARG names can not be blank",
            ));
        }
        out.push(ArgDecl { name, default });
    }
    Ok(out)
}

fn parse_copy(
    kw: &str,
    flags: &mut Flags,
    args: &str,
    heredocs: Vec<Heredoc>,
    line: usize,
) -> Result<Copy> {
    let add = kw == "add";
    let from = if add { None } else { flags.string("from")? };
    let chown = flags.string("chown")?;
    let chmod = flags.string("chmod")?;
    let link = flags.boolean("link")?;
    let parents = flags.boolean("parents")?;
    let exclude = flags.strings("exclude")?;
    let (checksum, keep_git_dir) = if add {
        (flags.string("checksum")?, flags.boolean("keep-git-dir")?)
    } else {
        (None, false)
    };
    if add {
        flags.finish(&[
            "chown",
            "chmod",
            "link",
            "parents",
            "exclude",
            "checksum",
            "keep-git-dir",
        ])?;
    } else {
        flags.finish(&["from", "chown", "chmod", "link", "parents", "exclude"])?;
    }
    let (words, json) = match json_array(args) {
        Some(v) => (v, true),
        None => (split_whitespace(args), false),
    };
    if words.len() < 2 {
        return Err(DockerfileError::new(
            line,
            kw,
            format!(
                "{} requires at least two arguments, but only {} provided: the destination could not be determined",
                kw.to_ascii_uppercase(),
                words.len()
            ),
        )
        .hint(format!("write {} SRC... DEST", kw.to_ascii_uppercase())));
    }
    let mut heredocs = heredocs.into_iter();
    let mut sources = Vec::new();
    let (dest, srcs) = words
        .split_last()
        .ok_or_else(|| DockerfileError::new(line, kw, "no arguments"))?;
    for w in srcs {
        if !json && heredoc_mark(w).is_some() {
            if let Some(h) = heredocs.next() {
                sources.push(Source::Heredoc(h));
                continue;
            }
        }
        sources.push(Source::Path(w.clone()));
    }
    Ok(Copy {
        from,
        chown,
        chmod,
        link,
        parents,
        exclude,
        checksum,
        keep_git_dir,
        sources,
        dest: dest.clone(),
        json,
    })
}

/// Parses a Go duration (`300ms`, `1m30s`, `1.5h`, `0`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if n == 0 {
            return None;
        }
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[u..];
        total += value * unit;
    }
    if !total.is_finite() || total > 1e12 {
        return None;
    }
    Some(Duration::from_secs_f64(total))
}

fn parse_healthcheck(flags: &mut Flags, args: &str, line: usize) -> Result<Healthcheck> {
    let err = |m: String| DockerfileError::new(line, "HEALTHCHECK", m);
    let (typ, rest) = split_keyword(args);
    match typ.to_ascii_uppercase().as_str() {
        "NONE" => {
            if !rest.is_empty() {
                return Err(err("HEALTHCHECK NONE takes no arguments".into()));
            }
            Ok(Healthcheck::None)
        }
        "CMD" => {
            let mut dur = |name: &str| -> Result<Option<Duration>> {
                match flags.string(name)? {
                    None => Ok(None),
                    Some(v) => {
                        let d = parse_duration(&v).ok_or_else(|| {
                            err(format!("--{name}: {v:?} is not a duration"))
                                .hint("use Go durations such as 30s, 1m30s, 500ms")
                        })?;
                        if d != Duration::ZERO && d < Duration::from_millis(1) {
                            return Err(err(format!("--{name} cannot be less than 1ms")));
                        }
                        Ok(Some(d))
                    }
                }
            };
            let interval = dur("interval")?;
            let timeout = dur("timeout")?;
            let start_period = dur("start-period")?;
            let start_interval = dur("start-interval")?;
            let retries =
                match flags.string("retries")? {
                    None => None,
                    Some(v) => Some(v.parse::<u32>().map_err(|_| {
                        err(format!("--retries: {v:?} is not a non-negative number"))
                    })?),
                };
            flags.finish(&[
                "interval",
                "timeout",
                "start-period",
                "start-interval",
                "retries",
            ])?;
            if rest.is_empty() {
                return Err(err("HEALTHCHECK CMD requires a command".into()));
            }
            Ok(Healthcheck::Cmd {
                command: parse_command(rest),
                interval,
                timeout,
                start_period,
                start_interval,
                retries,
            })
        }
        "" => Err(err("HEALTHCHECK requires an argument".into())
            .hint("write HEALTHCHECK NONE or HEALTHCHECK [OPTIONS] CMD COMMAND")),
        other => Err(err(format!(
            "unknown type {other:?} in HEALTHCHECK (try CMD)"
        ))),
    }
}

fn parse_instruction(
    kw: &str,
    flags: &mut Flags,
    args: &str,
    heredocs: Vec<Heredoc>,
    line: usize,
    escape: char,
) -> Result<Instr> {
    let upper = kw.to_ascii_uppercase();
    let need = |what: &str| -> Result<()> {
        if args.is_empty() {
            Err(DockerfileError::new(
                line,
                kw,
                format!("{upper} requires {what}"),
            ))
        } else {
            Ok(())
        }
    };
    let instr = match kw {
        "copy" | "add" => {
            let c = parse_copy(kw, flags, args, heredocs, line)?;
            return Ok(if kw == "add" {
                Instr::Add(c)
            } else {
                Instr::Copy(c)
            });
        }
        "run" => {
            let mounts_raw = flags.strings("mount")?;
            let network = match flags.string("network")?.as_deref() {
                None => None,
                Some("default") => Some(Network::Default),
                Some("none") => Some(Network::None),
                Some("host") => Some(Network::Host),
                Some(other) => {
                    return Err(DockerfileError::new(
                        line,
                        kw,
                        format!("network mode {other:?} not supported"),
                    )
                    .hint("use --network=default, none or host"))
                }
            };
            let security = match flags.string("security")?.as_deref() {
                None => None,
                Some("sandbox") => Some(Security::Sandbox),
                Some("insecure") => Some(Security::Insecure),
                Some(other) => {
                    return Err(DockerfileError::new(
                        line,
                        kw,
                        format!("security mode {other:?} not supported"),
                    )
                    .hint("use --security=sandbox or insecure"))
                }
            };
            flags.finish(&["mount", "network", "security"])?;
            let mut mounts = Vec::new();
            for spec in mounts_raw {
                // Values may hold variables: check the structure now, with
                // values that have `$` left unparsed where they must be numbers.
                let m = Mount::parse(&spec, &|s| Ok(s.to_owned())).or_else(|e| {
                    if spec.contains('$') {
                        Mount::parse(&spec, &|s| {
                            Ok(if s.contains('$') {
                                "0".to_owned()
                            } else {
                                s.to_owned()
                            })
                        })
                    } else {
                        Err(e)
                    }
                });
                let m =
                    m.map_err(|e| DockerfileError::new(line, kw, format!("--mount={spec}: {e}")))?;
                mounts.push(m);
            }
            need("at least one argument")?;
            Instr::Run(Run {
                mounts,
                network,
                security,
                command: parse_command(args),
                heredocs,
            })
        }
        "healthcheck" => return Ok(Instr::Healthcheck(parse_healthcheck(flags, args, line)?)),
        "onbuild" => {
            flags.finish(&[])?;
            need("at least one argument")?;
            let (inner_kw, inner_rest) = split_keyword(args);
            let inner = inner_kw.to_ascii_lowercase();
            match inner.as_str() {
                "onbuild" => {
                    return Err(DockerfileError::new(
                        line,
                        kw,
                        "chaining ONBUILD via `ONBUILD ONBUILD` isn't allowed",
                    ))
                }
                "from" | "maintainer" => {
                    return Err(DockerfileError::new(
                        line,
                        kw,
                        format!(
                            "{} isn't allowed as an ONBUILD trigger",
                            inner.to_uppercase()
                        ),
                    ))
                }
                _ => {}
            }
            if !KEYWORDS.contains(&inner.as_str()) {
                return Err(unknown_instruction(line, inner_kw));
            }
            let (fw, inner_args) =
                extract_flags(inner_rest).map_err(|m| DockerfileError::new(line, &inner, m))?;
            let mut inner_flags = Flags::new(fw, line, &inner)?;
            let kind = parse_instruction(
                &inner,
                &mut inner_flags,
                inner_args,
                Vec::new(),
                line,
                escape,
            )?;
            Instr::Onbuild(Onbuild {
                expression: args.to_owned(),
                instruction: Box::new(Instruction {
                    line,
                    end_line: line,
                    original: args.to_owned(),
                    kind,
                }),
            })
        }
        _ => {
            flags.finish(&[])?;
            match kw {
                "arg" => Instr::Arg(parse_arg(args, line, escape)?),
                "env" => Instr::Env(parse_name_val(args, kw, line, escape)?),
                "label" => Instr::Label(parse_name_val(args, kw, line, escape)?),
                "workdir" => {
                    need("exactly one argument")?;
                    Instr::Workdir(args.to_owned())
                }
                "user" => {
                    need("exactly one argument")?;
                    Instr::User(args.to_owned())
                }
                "cmd" => {
                    need("at least one argument")?;
                    Instr::Cmd(parse_command(args))
                }
                "entrypoint" => {
                    need("at least one argument")?;
                    Instr::Entrypoint(parse_command(args))
                }
                "shell" => match json_array(args) {
                    Some(v) if !v.is_empty() => Instr::Shell(v),
                    Some(_) => {
                        return Err(DockerfileError::new(
                            line,
                            kw,
                            "SHELL requires at least one argument",
                        ))
                    }
                    None => {
                        return Err(DockerfileError::new(
                            line,
                            kw,
                            "SHELL requires the arguments to be in JSON form",
                        )
                        .hint("write SHELL [\"/bin/sh\", \"-c\"]"))
                    }
                },
                "expose" => {
                    need("at least one argument")?;
                    Instr::Expose(split_whitespace(args))
                }
                "volume" => {
                    need("at least one argument")?;
                    let v = json_array(args).unwrap_or_else(|| split_whitespace(args));
                    if v.is_empty() || v.iter().any(|p| p.trim().is_empty()) {
                        return Err(DockerfileError::new(
                            line,
                            kw,
                            "VOLUME specified can not be an empty string",
                        ));
                    }
                    Instr::Volume(v)
                }
                "stopsignal" => {
                    need("exactly one argument")?;
                    Instr::StopSignal(args.to_owned())
                }
                "maintainer" => {
                    need("exactly one argument")?;
                    Instr::Maintainer(args.to_owned())
                }
                _ => return Err(unknown_instruction(line, kw)),
            }
        }
    };
    Ok(instr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(src: &str) -> Instr {
        let df = parse_str(&format!("FROM scratch\n{src}\n")).expect(src);
        assert_eq!(df.stages[0].instructions.len(), 1, "{src}");
        df.stages[0].instructions[0].kind.clone()
    }

    fn err(src: &str) -> DockerfileError {
        parse_str(src).expect_err(src)
    }

    fn kv(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
        pairs
            .iter()
            .map(|(k, v)| KeyValue {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect()
    }

    #[test]
    fn directives() {
        let df = parse_str("# syntax=docker/dockerfile:1\n# ESCAPE = `\nFROM x\n").expect("ok");
        assert_eq!(df.directives.syntax.as_deref(), Some("docker/dockerfile:1"));
        assert_eq!(df.directives.escape, '`');
        // Directives only at the very top: after a comment they are comments.
        let df = parse_str("# hello\n# escape=`\nFROM x\n").expect("ok");
        assert_eq!(df.directives.escape, '\\');
        // After a blank line too.
        let df = parse_str("\n# escape=`\nFROM x\n").expect("ok");
        assert_eq!(df.directives.escape, '\\');
        // An unknown directive ends them.
        let df = parse_str("# foo=bar\n# escape=`\nFROM x\n").expect("ok");
        assert_eq!(df.directives.escape, '\\');
        // Whitespace is allowed anywhere.
        let df = parse_str("#escape=`\nFROM x\n").expect("ok");
        assert_eq!(df.directives.escape, '`');
        let df = parse_str("#\t escape =\t` \nFROM x\n").expect("ok");
        assert_eq!(df.directives.escape, '`');
        let df = parse_str("# check=skip=all\nFROM x\n").expect("ok");
        assert_eq!(df.directives.check.as_deref(), Some("skip=all"));
        // Twice is an error; a bad escape is an error.
        assert_eq!(err("# escape=\\\n# escape=`\nFROM x\n").line, 2);
        assert!(err("# escape=x\nFROM x\n").message.contains("escape"));
        // BOM.
        let df = parse_str("\u{feff}# escape=`\nFROM x\n").expect("ok");
        assert_eq!(df.directives.escape, '`');
    }

    #[test]
    fn continuation_and_comments() {
        let df = parse_str(
            "FROM x\nRUN echo a \\\n  b\n# c\n  RUN echo \\\n# dropped\n\n   c \\  \n d\nrun x\n",
        )
        .expect("ok");
        let ins = &df.stages[0].instructions;
        assert_eq!(ins.len(), 3);
        assert_eq!(ins[0].kind, Instr::Run(run_shell("echo a   b")));
        assert_eq!(ins[0].line, 2);
        assert_eq!(ins[1].kind, Instr::Run(run_shell("echo    c  d")));
        assert_eq!(ins[1].line, 5);
        assert_eq!(ins[2].line, 10);
        // Backtick escape: backslash is ordinary.
        let df = parse_str("# escape=`\nFROM x\nRUN dir c:\\ `\n  d\n").expect("ok");
        assert_eq!(
            df.stages[0].instructions[0].kind,
            Instr::Run(run_shell("dir c:\\   d"))
        );
        // `#` not at the start of a line is an argument.
        assert_eq!(
            one("RUN echo 'a # b' # c"),
            Instr::Run(run_shell("echo 'a # b' # c"))
        );
        // CRLF.
        let df = parse_str("FROM x\r\nRUN a \\\r\n b\r\n").expect("ok");
        assert_eq!(
            df.stages[0].instructions[0].kind,
            Instr::Run(run_shell("a  b"))
        );
        // A continuation at the end of the file.
        let df = parse_str("FROM x\nRUN a \\").expect("ok");
        assert_eq!(
            df.stages[0].instructions[0].kind,
            Instr::Run(run_shell("a"))
        );
    }

    fn run_shell(s: &str) -> Run {
        Run {
            mounts: vec![],
            network: None,
            security: None,
            command: Command::Shell(s.into()),
            heredocs: vec![],
        }
    }

    #[test]
    fn from_and_stages() {
        let df = parse_str(
            "ARG V=1\nARG A B=2\nfrom --platform=$BUILDPLATFORM alpine:$V As Build\nFROM build\nFROM scratch AS out.2\n",
        )
        .expect("ok");
        assert_eq!(df.args_before_from.len(), 2);
        assert_eq!(
            df.args_before_from[1].decls,
            vec![
                ArgDecl {
                    name: "A".into(),
                    default: None
                },
                ArgDecl {
                    name: "B".into(),
                    default: Some("2".into())
                }
            ]
        );
        assert_eq!(df.stages.len(), 3);
        assert_eq!(
            df.stages[0].from,
            From {
                image: "alpine:$V".into(),
                platform: Some("$BUILDPLATFORM".into()),
                name: Some("build".into())
            }
        );
        assert_eq!(df.stages[0].line, 3);
        assert_eq!(df.stages[2].name.as_deref(), Some("out.2"));
        for bad in [
            "FROM\n",
            "FROM a b\n",
            "FROM a AS\n",
            "FROM a IS b\n",
            "FROM a AS 1x\n",
            "FROM a AS a/b\n",
            "FROM a AS x\nFROM b AS X\n",
            "FROM --foo=1 a\n",
            "RUN x\nFROM a\n",
            "ENV a=b\n",
            "",
            "# just a comment\n",
        ] {
            let e = err(bad);
            assert!(!e.message.is_empty(), "{bad:?}");
        }
        assert_eq!(err("FROM a\nFROM b AS a\nFROM c AS A\n").line, 3);
        assert_eq!(err("RUN x\nFROM a\n").to_string(), "Dockerfile:1: RUN: no build stage in current context; only ARG instructions may come before the first FROM");
    }

    #[test]
    fn unknown_instruction_has_line_and_hint() {
        let e = err("FROM a\n\nRUNN x\n");
        assert_eq!(e.line, 3);
        assert_eq!(
            e.to_string(),
            "Dockerfile:3: unknown instruction: RUNN; did you mean RUN?"
        );
        assert_eq!(
            e.in_file("ctx/Dockerfile.dev").to_string(),
            "ctx/Dockerfile.dev:3: unknown instruction: RUNN; did you mean RUN?"
        );
        assert!(err("FROM a\nFROBNICATE x\n").hint.is_none());
    }

    #[test]
    fn exec_and_shell_forms() {
        let cases: &[(&str, Instr)] = &[
            (
                "CMD [\"a\", \"b c\"]",
                Instr::Cmd(Command::Exec(vec!["a".into(), "b c".into()])),
            ),
            ("CMD  [ ]", Instr::Cmd(Command::Exec(vec![]))),
            ("CMD ['a']", Instr::Cmd(Command::Shell("['a']".into()))),
            (
                "CMD [\"a\", 1]",
                Instr::Cmd(Command::Shell("[\"a\", 1]".into())),
            ),
            ("CMD [\"a\"", Instr::Cmd(Command::Shell("[\"a\"".into()))),
            ("cmd echo hi", Instr::Cmd(Command::Shell("echo hi".into()))),
            (
                "ENTRYPOINT [\"/bin/sh\", \"-c\"]",
                Instr::Entrypoint(Command::Exec(vec!["/bin/sh".into(), "-c".into()])),
            ),
            (
                "ENTRYPOINT exec x",
                Instr::Entrypoint(Command::Shell("exec x".into())),
            ),
            (
                "SHELL [\"/bin/bash\", \"-eu\", \"-c\"]",
                Instr::Shell(vec!["/bin/bash".into(), "-eu".into(), "-c".into()]),
            ),
            (
                "RUN [\"echo\", \"\\\"q\\\"\"]",
                Instr::Run(Run {
                    command: Command::Exec(vec!["echo".into(), "\"q\"".into()]),
                    ..run_shell("")
                }),
            ),
        ];
        for (src, want) in cases {
            assert_eq!(one(src), *want, "{src}");
        }
        for bad in ["SHELL /bin/sh -c", "SHELL []", "RUN", "CMD", "ENTRYPOINT"] {
            err(&format!("FROM x\n{bad}\n"));
        }
    }

    #[test]
    fn env_label_arg() {
        let cases: &[(&str, Instr)] = &[
            ("ENV a=b", Instr::Env(kv(&[("a", "b")]))),
            (
                "ENV a=b c=\"d e\"",
                Instr::Env(kv(&[("a", "b"), ("c", "\"d e\"")])),
            ),
            ("ENV a b c", Instr::Env(kv(&[("a", "b c")]))),
            ("ENV a   \"b c\"", Instr::Env(kv(&[("a", "\"b c\"")]))),
            ("ENV a=x\\ y", Instr::Env(kv(&[("a", "x\\ y")]))),
            ("ENV a=", Instr::Env(kv(&[("a", "")]))),
            ("ENV a=b=c", Instr::Env(kv(&[("a", "b=c")]))),
            (
                "ENV a='$x' b=$y",
                Instr::Env(kv(&[("a", "'$x'"), ("b", "$y")])),
            ),
            (
                "LABEL \"com.x\"=\"v 1\" b=2",
                Instr::Label(kv(&[("\"com.x\"", "\"v 1\""), ("b", "2")])),
            ),
            ("LABEL version 1.0", Instr::Label(kv(&[("version", "1.0")]))),
            (
                "ARG a b=1 c=\"x y\"",
                Instr::Arg(vec![
                    ArgDecl {
                        name: "a".into(),
                        default: None,
                    },
                    ArgDecl {
                        name: "b".into(),
                        default: Some("1".into()),
                    },
                    ArgDecl {
                        name: "c".into(),
                        default: Some("\"x y\"".into()),
                    },
                ]),
            ),
            (
                "ARG a=",
                Instr::Arg(vec![ArgDecl {
                    name: "a".into(),
                    default: Some(String::new()),
                }]),
            ),
        ];
        for (src, want) in cases {
            assert_eq!(one(src), *want, "{src}");
        }
        for bad in [
            "ENV",
            "ENV a",
            "ENV a=b c",
            "ENV =b",
            "LABEL",
            "ARG",
            "ARG =x",
            "ENV --x=1 a=b",
        ] {
            err(&format!("FROM x\n{bad}\n"));
        }
    }

    #[test]
    fn run_flags_and_mounts() {
        let Instr::Run(r) = one(
            "RUN --mount=type=cache,target=/root/.cache,id=pip,sharing=locked,mode=0700,uid=1000,gid=1000 \\\n  --mount=type=secret,id=tok,required,env=TOKEN --mount=target=/src,from=build,source=/out,rw \\\n  --mount=type=tmpfs,target=/t,size=64m --network=none --security=insecure make",
        ) else {
            panic!("not RUN")
        };
        assert_eq!(r.network, Some(Network::None));
        assert_eq!(r.security, Some(Security::Insecure));
        assert_eq!(r.command, Command::Shell("make".into()));
        assert_eq!(r.mounts.len(), 4);
        let c = &r.mounts[0];
        assert_eq!(c.kind, MountType::Cache);
        assert_eq!(c.target.as_deref(), Some("/root/.cache"));
        assert_eq!(c.id.as_deref(), Some("pip"));
        assert_eq!(c.sharing, Sharing::Locked);
        assert_eq!(c.mode, Some(0o700));
        assert_eq!((c.uid, c.gid), (Some(1000), Some(1000)));
        assert!(!c.readonly);
        let s = &r.mounts[1];
        assert_eq!(s.kind, MountType::Secret);
        assert!(s.required);
        assert_eq!(s.env.as_deref(), Some("TOKEN"));
        let b = &r.mounts[2];
        assert_eq!(b.kind, MountType::Bind);
        assert_eq!(b.from.as_deref(), Some("build"));
        assert_eq!(b.source.as_deref(), Some("/out"));
        assert!(!b.readonly);
        let t = &r.mounts[3];
        assert_eq!(t.kind, MountType::Tmpfs);
        assert_eq!(t.size, Some(64 << 20));
        // Bind mounts are read-only by default; ro on a cache.
        let Instr::Run(r) =
            one("RUN --mount=type=bind,target=/x --mount=type=cache,target=/c,ro true")
        else {
            panic!()
        };
        assert!(r.mounts[0].readonly);
        assert!(r.mounts[1].readonly);
        // Quoted flag values; variables are kept for later.
        let Instr::Run(r) = one(
            "RUN --mount=\"type=bind,target=/a b\" --mount=type=cache,target=$HOME/.c,uid=$UID x",
        ) else {
            panic!()
        };
        assert_eq!(r.mounts[0].target.as_deref(), Some("/a b"));
        assert_eq!(r.mounts[1].spec, "type=cache,target=$HOME/.c,uid=$UID");
        for bad in [
            "RUN --mount=type=foo,target=/x x",
            "RUN --mount=type=cache x",
            "RUN --mount=type=cache,target=/x,sharing=weird x",
            "RUN --mount=type=cache,target=/x,mode=9 x",
            "RUN --mount=type=cache,target=/x,uid=a x",
            "RUN --mount=type=cache,target=/x,bogus=1 x",
            "RUN --mount=type=cache,target x",
            "RUN --mount x",
            "RUN --network=bridge x",
            "RUN --security=x x",
            "RUN --network=none --network=host x",
            "RUN --privileged x",
        ] {
            let e = err(&format!("FROM x\n{bad}\n"));
            assert_eq!(e.line, 2, "{bad}");
            assert_eq!(e.instruction, "RUN", "{bad}");
        }
        assert_eq!(
            err("FROM x\nRUN --privileged x\n").to_string(),
            "Dockerfile:2: RUN: unknown flag: --privileged; allowed: --mount, --network, --security"
        );
        // A lone `--` ends the flags.
        assert_eq!(one("RUN -- --x"), Instr::Run(run_shell("--x")));
    }

    #[test]
    fn heredocs() {
        let df = parse_str(
            "FROM x\nRUN <<EOF\necho a\n  echo $b\nEOF\nRUN cat <<-\"END\" > /f && 3<<'X' cmd\n\t\tline1\n\tline2\n\tEND\nx $y\nX\nCOPY <<A <<-B /dir/\na\nA\n\tb\n\tB\nCMD x\n",
        )
        .expect("ok");
        let ins = &df.stages[0].instructions;
        assert_eq!(ins.len(), 4);
        let Instr::Run(r) = &ins[0].kind else {
            panic!()
        };
        assert_eq!(r.command, Command::Shell("<<EOF".into()));
        assert_eq!(
            r.heredocs,
            vec![Heredoc {
                name: "EOF".into(),
                content: "echo a\n  echo $b\n".into(),
                expand: true,
                chomp: false,
                fd: None
            }]
        );
        assert_eq!((ins[0].line, ins[0].end_line), (2, 5));
        let Instr::Run(r) = &ins[1].kind else {
            panic!()
        };
        assert_eq!(r.heredocs.len(), 2);
        assert_eq!(r.heredocs[0].name, "END");
        assert_eq!(r.heredocs[0].content, "line1\nline2\n");
        assert!(!r.heredocs[0].expand);
        assert!(r.heredocs[0].chomp);
        assert_eq!(r.heredocs[1].name, "X");
        assert_eq!(r.heredocs[1].fd, Some(3));
        assert_eq!(r.heredocs[1].content, "x $y\n");
        assert_eq!(ins[1].line, 6);
        let Instr::Copy(c) = &ins[2].kind else {
            panic!()
        };
        assert_eq!(c.dest, "/dir/");
        assert_eq!(c.sources.len(), 2);
        let Source::Heredoc(a) = &c.sources[0] else {
            panic!()
        };
        assert_eq!((a.name.as_str(), a.content.as_str()), ("A", "a\n"));
        let Source::Heredoc(b) = &c.sources[1] else {
            panic!()
        };
        assert_eq!((b.name.as_str(), b.content.as_str()), ("B", "b\n"));
        assert_eq!(ins[3].kind, Instr::Cmd(Command::Shell("x".into())));
        assert_eq!(ins[3].line, 17);
        // Body lines are not instructions or comments.
        let df = parse_str("FROM x\nCOPY <<EOF /f\n# not a comment\nFROM y\n\nEOF\n").expect("ok");
        assert_eq!(df.stages.len(), 1);
        let Instr::Copy(c) = &df.stages[0].instructions[0].kind else {
            panic!()
        };
        let Source::Heredoc(h) = &c.sources[0] else {
            panic!()
        };
        assert_eq!(h.content, "# not a comment\nFROM y\n\n");
        // Empty body; `<<` alone or quoted is not a heredoc.
        let df = parse_str("FROM x\nRUN <<E\nE\nRUN echo '<<X' << Y\n").expect("ok");
        assert_eq!(df.stages[0].instructions.len(), 2);
        // Unterminated.
        let e = err("FROM x\nRUN <<EOF\necho\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("unterminated heredoc"));
        // A heredoc after a continuation.
        let df = parse_str("FROM x\nRUN --network=none \\\n  <<EOF\nhi\nEOF\n").expect("ok");
        let Instr::Run(r) = &df.stages[0].instructions[0].kind else {
            panic!()
        };
        assert_eq!(r.heredocs[0].content, "hi\n");
        assert_eq!(r.network, Some(Network::None));
        // Not for other instructions.
        let df = parse_str("FROM x\nENV a=<<EOF\n").expect("ok");
        assert_eq!(df.stages[0].instructions.len(), 1);
    }

    #[test]
    fn copy_add() {
        let Instr::Copy(c) = one(
            "COPY --from=build --chown=app:app --chmod=0755 --link --exclude=*.md --exclude=x a b /dst/",
        ) else {
            panic!()
        };
        assert_eq!(c.from.as_deref(), Some("build"));
        assert_eq!(c.chown.as_deref(), Some("app:app"));
        assert_eq!(c.chmod.as_deref(), Some("0755"));
        assert!(c.link && !c.parents);
        assert_eq!(c.exclude, ["*.md", "x"]);
        assert_eq!(
            c.sources,
            vec![Source::Path("a".into()), Source::Path("b".into())]
        );
        assert_eq!(c.dest, "/dst/");
        assert!(!c.json);
        let Instr::Copy(c) = one("COPY [\"a b\", \"/c d/\"]") else {
            panic!()
        };
        assert_eq!(c.sources, vec![Source::Path("a b".into())]);
        assert_eq!(c.dest, "/c d/");
        assert!(c.json);
        let Instr::Copy(c) = one("COPY --link=false --parents a /b") else {
            panic!()
        };
        assert!(!c.link && c.parents);
        let Instr::Add(a) = one("ADD --checksum=sha256:abc --keep-git-dir=true https://x/y.tgz /z")
        else {
            panic!()
        };
        assert_eq!(a.checksum.as_deref(), Some("sha256:abc"));
        assert!(a.keep_git_dir);
        for bad in [
            "COPY a",
            "COPY",
            "COPY [\"a\"]",
            "COPY --from a /b",
            "COPY --checksum=x a /b",
            "ADD --from=x a /b",
            "COPY --link=maybe a /b",
            "COPY --chown=a --chown=b a /b",
        ] {
            let e = err(&format!("FROM x\n{bad}\n"));
            assert_eq!(e.line, 2, "{bad}");
        }
        assert!(err("FROM x\nCOPY a\n")
            .to_string()
            .contains("COPY SRC... DEST"));
    }

    #[test]
    fn simple_instructions() {
        let cases: &[(&str, Instr)] = &[
            ("WORKDIR /a b", Instr::Workdir("/a b".into())),
            ("USER app:app", Instr::User("app:app".into())),
            ("EXPOSE 80 443/tcp", Instr::Expose(vec!["80".into(), "443/tcp".into()])),
            ("VOLUME /a /b", Instr::Volume(vec!["/a".into(), "/b".into()])),
            ("VOLUME [\"/a b\"]", Instr::Volume(vec!["/a b".into()])),
            ("STOPSIGNAL SIGKILL", Instr::StopSignal("SIGKILL".into())),
            ("MAINTAINER Jo <jo@x>", Instr::Maintainer("Jo <jo@x>".into())),
            ("HEALTHCHECK NONE", Instr::Healthcheck(Healthcheck::None)),
            (
                "HEALTHCHECK --interval=5m --timeout=3s --start-period=1m30s --start-interval=500ms --retries=3 CMD curl -f http://x/",
                Instr::Healthcheck(Healthcheck::Cmd {
                    command: Command::Shell("curl -f http://x/".into()),
                    interval: Some(Duration::from_secs(300)),
                    timeout: Some(Duration::from_secs(3)),
                    start_period: Some(Duration::from_secs(90)),
                    start_interval: Some(Duration::from_millis(500)),
                    retries: Some(3),
                }),
            ),
            (
                "healthcheck cmd [\"true\"]",
                Instr::Healthcheck(Healthcheck::Cmd {
                    command: Command::Exec(vec!["true".into()]),
                    interval: None,
                    timeout: None,
                    start_period: None,
                    start_interval: None,
                    retries: None,
                }),
            ),
        ];
        for (src, want) in cases {
            assert_eq!(one(src), *want, "{src}");
        }
        for bad in [
            "WORKDIR",
            "USER",
            "EXPOSE",
            "VOLUME",
            "VOLUME [\"\"]",
            "STOPSIGNAL",
            "HEALTHCHECK",
            "HEALTHCHECK NONE x",
            "HEALTHCHECK FOO x",
            "HEALTHCHECK CMD",
            "HEALTHCHECK --interval=5 CMD x",
            "HEALTHCHECK --interval=1ns CMD x",
            "HEALTHCHECK --retries=-1 CMD x",
            "HEALTHCHECK --bogus=1 CMD x",
            "WORKDIR --x=1 /a",
        ] {
            let e = err(&format!("FROM x\n{bad}\n"));
            assert_eq!(e.line, 2, "{bad}");
        }
    }

    #[test]
    fn onbuild() {
        let Instr::Onbuild(o) = one("ONBUILD RUN --mount=type=cache,target=/c make $X") else {
            panic!()
        };
        assert_eq!(o.expression, "RUN --mount=type=cache,target=/c make $X");
        let Instr::Run(r) = &o.instruction.kind else {
            panic!()
        };
        assert_eq!(r.mounts.len(), 1);
        let Instr::Onbuild(o) = one("onbuild copy . /app") else {
            panic!()
        };
        assert_eq!(o.instruction.keyword(), "COPY");
        for bad in [
            "ONBUILD ONBUILD RUN x",
            "ONBUILD FROM x",
            "ONBUILD MAINTAINER x",
            "ONBUILD",
            "ONBUILD FOO x",
            "ONBUILD COPY a",
        ] {
            let e = err(&format!("FROM x\n{bad}\n"));
            assert_eq!(e.line, 2, "{bad}");
        }
    }

    #[test]
    fn run_heredoc_helpers() {
        let df = parse_str(
            "FROM x\nRUN <<EOF\necho a\nEOF\nRUN python3 <<EOF\nprint(1)\nEOF\nRUN <<A <<B\na\nA\nb\nB\nRUN 3<<X cat\nx\nX\nRUN echo\n",
        )
        .expect("ok");
        let runs: Vec<&Run> = df.stages[0]
            .instructions
            .iter()
            .filter_map(|i| match &i.kind {
                Instr::Run(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(
            runs[0].script_heredoc().map(|h| h.content.as_str()),
            Some("echo a\n")
        );
        assert!(runs[1].script_heredoc().is_none());
        assert!(runs[2].script_heredoc().is_none());
        assert!(runs[3].script_heredoc().is_none());
        assert!(runs[4].script_heredoc().is_none());
        assert_eq!(
            runs[1].shell_script_with_heredocs().as_deref(),
            Some("python3 <<EOF\nprint(1)\nEOF\n")
        );
        assert_eq!(
            runs[4].shell_script_with_heredocs().as_deref(),
            Some("echo")
        );
    }

    #[test]
    fn mount_defaults() {
        let m = |spec: &str| Mount::parse(spec, &|s| Ok(s.to_owned())).expect(spec);
        let s = m("type=secret,id=tok");
        assert_eq!(s.effective_target().as_deref(), Some("/run/secrets/tok"));
        assert_eq!(s.effective_mode(), Some(0o400));
        let s = m("type=secret,target=/etc/creds/aws");
        assert_eq!(s.effective_id().as_deref(), Some("aws"));
        let c = m("type=cache,target=/var/cache/apt");
        assert_eq!(c.effective_id().as_deref(), Some("/var/cache/apt"));
        assert_eq!(c.effective_mode(), Some(0o755));
        let c = m("type=cache,target=/c,mode=0777,id=x");
        assert_eq!(
            (c.effective_id().as_deref(), c.effective_mode()),
            (Some("x"), Some(0o777))
        );
        let h = m("type=ssh");
        assert_eq!(
            h.effective_target().as_deref(),
            Some("/run/buildkit/ssh_agent.0")
        );
        let b = m("target=/src");
        assert_eq!((b.kind, b.effective_mode()), (MountType::Bind, None));
    }

    #[test]
    fn onbuild_triggers() {
        let i = parse_trigger("COPY . /app", '\\', 1).expect("ok");
        assert_eq!(i.keyword(), "COPY");
        assert_eq!(i.line, 1);
        let i = parse_trigger("RUN echo a `\n b", '`', 4).expect("ok");
        assert_eq!(i.kind, Instr::Run(run_shell("echo a  b")));
        for bad in [
            "",
            "FROM x",
            "RUN a\nRUN b",
            "MAINTAINER x",
            "ONBUILD RUN x",
            "BOGUS x",
        ] {
            let e = parse_trigger(bad, '\\', 7).expect_err(bad);
            assert_eq!(e.line, 7, "{bad}");
        }
    }

    #[test]
    fn durations() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("0", Some(Duration::ZERO)),
            ("30s", Some(Duration::from_secs(30))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("1.5h", Some(Duration::from_secs(5400))),
            ("250ms", Some(Duration::from_millis(250))),
            ("10us", Some(Duration::from_micros(10))),
            ("10", None),
            ("", None),
            ("-1s", None),
            ("1x", None),
            ("s", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_duration(s), *want, "{s}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999t").is_err());
    }
}
