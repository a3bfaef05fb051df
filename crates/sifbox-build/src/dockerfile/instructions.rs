//! Parsing one instruction: the keyword, the `--flag`s before the
//! arguments, exec or shell form, and each instruction's own arguments.

use std::time::Duration;

use super::reader::heredoc_mark;
use super::{
    ArgDecl, Command, Copy, DockerfileError, From, Healthcheck, Heredoc, Instr, Instruction,
    KeyValue, Mount, Network, Onbuild, Result, Run, Security, Source,
};
use crate::lex::{split_whitespace, split_words};

/// The instruction keywords Docker knows.
pub(super) const KEYWORDS: &[&str] = &[
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

pub(super) fn unknown_instruction(line: usize, keyword: &str) -> DockerfileError {
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

pub(super) fn split_keyword(text: &str) -> (&str, &str) {
    match text.find(char::is_whitespace) {
        Some(i) => (&text[..i], text[i..].trim()),
        None => (text, ""),
    }
}

/// Takes the leading `--flag[=value]` words off `s` (quotes removed,
/// backslash escapes honoured; a lone `--` ends them). Returns the flags
/// and the rest.
pub(super) fn extract_flags(s: &str) -> std::result::Result<(Vec<String>, &str), String> {
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
pub(super) struct Flags {
    items: Vec<(String, Option<String>)>,
    line: usize,
    kw: String,
}

impl Flags {
    pub(super) fn new(words: Vec<String>, line: usize, kw: &str) -> Result<Self> {
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

pub(super) fn parse_from(flags: &mut Flags, args: &str, line: usize) -> Result<From> {
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

pub(super) fn parse_instruction(
    kw: &str,
    flags: &mut Flags,
    args: &str,
    heredocs: Vec<Heredoc>,
    line: usize,
    escape: char,
) -> Result<Instr> {
    let instr = match kw {
        "copy" | "add" => {
            let c = parse_copy(kw, flags, args, heredocs, line)?;
            return Ok(if kw == "add" {
                Instr::Add(c)
            } else {
                Instr::Copy(c)
            });
        }
        "run" => Instr::Run(parse_run(kw, flags, args, heredocs, line)?),
        "healthcheck" => return Ok(Instr::Healthcheck(parse_healthcheck(flags, args, line)?)),
        "onbuild" => Instr::Onbuild(parse_onbuild(kw, flags, args, line, escape)?),
        _ => {
            flags.finish(&[])?;
            parse_plain(kw, args, line, escape)?
        }
    };
    Ok(instr)
}

/// An error unless the instruction has arguments: `KW requires WHAT`.
fn require_args(kw: &str, args: &str, line: usize, what: &str) -> Result<()> {
    if args.is_empty() {
        Err(DockerfileError::new(
            line,
            kw,
            format!("{} requires {what}", kw.to_ascii_uppercase()),
        ))
    } else {
        Ok(())
    }
}

/// RUN: its `--mount`s (checked now, variables left for the build),
/// `--network` and `--security`, and the command.
fn parse_run(
    kw: &str,
    flags: &mut Flags,
    args: &str,
    heredocs: Vec<Heredoc>,
    line: usize,
) -> Result<Run> {
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
        let m = m.map_err(|e| DockerfileError::new(line, kw, format!("--mount={spec}: {e}")))?;
        mounts.push(m);
    }
    require_args(kw, args, line, "at least one argument")?;
    Ok(Run {
        mounts,
        network,
        security,
        command: parse_command(args),
        heredocs,
    })
}

/// ONBUILD: the trigger, parsed as an instruction of its own (not
/// ONBUILD, FROM or MAINTAINER).
fn parse_onbuild(
    kw: &str,
    flags: &mut Flags,
    args: &str,
    line: usize,
    escape: char,
) -> Result<Onbuild> {
    flags.finish(&[])?;
    require_args(kw, args, line, "at least one argument")?;
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
    Ok(Onbuild {
        expression: args.to_owned(),
        instruction: Box::new(Instruction {
            line,
            end_line: line,
            original: args.to_owned(),
            kind,
        }),
    })
}

/// The instructions that take no flags.
fn parse_plain(kw: &str, args: &str, line: usize, escape: char) -> Result<Instr> {
    let need = |what: &str| require_args(kw, args, line, what);
    Ok(match kw {
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
