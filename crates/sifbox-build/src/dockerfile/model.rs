//! The typed model of a Dockerfile: the file, its stages and their
//! instructions (RUN, COPY/ADD, HEALTHCHECK, ONBUILD...), values kept raw.

use std::time::Duration;

use serde::Serialize;

use super::mounts::Mount;
use super::reader::heredoc_mark;
use super::DockerfileError;
use crate::lex::split_words;

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
