//! Dockerfile parsing into a typed model, with Docker's rules: parser
//! directives at the very top, comments, line continuations (comment and
//! empty lines inside one are dropped), case-insensitive keywords,
//! `--flag=value` before the arguments, JSON (exec) or shell form,
//! heredocs for RUN/COPY/ADD.
//!
//! Values that Docker substitutes variables in are kept raw here (quotes
//! included); [`crate::plan::StageEnv::apply`] expands them
//! with the right environment at the right time.

mod instructions;
mod model;
mod mounts;
mod reader;

use std::fmt;

pub use instructions::parse_duration;
use instructions::{
    extract_flags, parse_from, parse_instruction, split_keyword, unknown_instruction, Flags,
    KEYWORDS,
};
pub use model::{
    Arg, ArgDecl, Command, Copy, Directives, Dockerfile, From, Healthcheck, Heredoc, Instr,
    Instruction, KeyValue, Network, Onbuild, Run, Security, Source, Stage,
};
pub use mounts::{Mount, MountType, Sharing};

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
    let lines = reader::split_lines(src);
    let (directives, first) = reader::parse_directives(&lines)?;
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
        let text = reader::join_continuations(&lines, trimmed, &mut i, escape);
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
            reader::read_heredocs(&lines, &mut i, args)
                .map_err(|m| DockerfileError::new(line, &kw, m))?
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
}
