//! Reading the file: lines, parser directives, continuation lines and
//! heredoc bodies, before any instruction is parsed.

use super::{Directives, DockerfileError, Heredoc, Result};
use crate::lex::split_words;

/// The file's lines (a leading BOM dropped, `\n` or `\r\n` line ends).
pub(super) fn split_lines(src: &str) -> Vec<&str> {
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    src.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect()
}

/// Reads the directives; returns them and the index of the first line that
/// is not one.
pub(super) fn parse_directives(lines: &[&str]) -> Result<(Directives, usize)> {
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

/// Joins an instruction's first line `first` (already trimmed at the
/// start) with its continuation lines from `lines[*i]` on, dropping the
/// comment and empty lines among them; moves `*i` past them.
pub(super) fn join_continuations(
    lines: &[&str],
    first: &str,
    i: &mut usize,
    escape: char,
) -> String {
    let mut text = String::new();
    let mut cont = strip_continuation(first, escape);
    match cont {
        Some(head) => text.push_str(head),
        None => text.push_str(first),
    }
    while cont.is_some() && *i < lines.len() {
        let l = lines[*i];
        *i += 1;
        let t = l.trim_start();
        if t.starts_with('#') || t.trim_end().is_empty() {
            continue;
        }
        cont = strip_continuation(l, escape);
        text.push_str(cont.unwrap_or(l));
    }
    text
}

/// Reads the bodies of the heredocs marked in `args`, in order, from
/// `lines[*i]` on; moves `*i` past the last terminator.
pub(super) fn read_heredocs(
    lines: &[&str],
    i: &mut usize,
    args: &str,
) -> std::result::Result<Vec<Heredoc>, String> {
    let marks = heredoc_marks(args);
    let mut docs = Vec::new();
    for mark in marks {
        let (content, next) = read_heredoc(lines, *i, &mark)?;
        *i = next;
        docs.push(Heredoc {
            name: mark.name,
            content,
            expand: mark.expand,
            chomp: mark.chomp,
            fd: mark.fd,
        });
    }
    Ok(docs)
}

/// A heredoc marker found in a line.
#[derive(Debug)]
pub(super) struct Mark {
    pub(super) name: String,
    expand: bool,
    chomp: bool,
    pub(super) fd: Option<u32>,
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

pub(super) fn heredoc_mark(word: &str) -> Option<Mark> {
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
