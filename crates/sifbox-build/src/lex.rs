//! Docker's variable substitution (the Dockerfile "shell lexer") and the
//! word splitting the Dockerfile parser does before it.
//!
//! Substitution applies where Docker applies it (ADD, COPY, ENV, EXPOSE,
//! FROM, LABEL, STOPSIGNAL, USER, VOLUME, WORKDIR, ARG defaults and flags
//! such as `--chown` / `--from`), never to RUN, CMD or ENTRYPOINT, whose
//! shell does its own. Supported forms, as the Dockerfile reference lists
//! them: `$name`, `${name}`, `${name:-word}`, `${name:+word}`, plus what
//! BuildKit's lexer also accepts: `${name-word}`, `${name+word}`,
//! `${name?msg}`, `${name:?msg}`, `${name#pat}`, `${name##pat}`,
//! `${name%pat}`, `${name%%pat}`, `${name/pat/rep}` and `${name//pat/rep}`.
//! The escape character (`\` or the `# escape=` one) makes the next
//! character literal; single quotes suppress substitution, double quotes
//! allow it; quotes are removed.

use std::collections::{BTreeMap, HashMap};

/// A substitution that cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LexError {
    /// A quote that is never closed.
    #[error("unexpected end of text while looking for the matching {0} quote")]
    UnterminatedQuote(&'static str),
    /// `${` without its `}`.
    #[error("missing '}}' to close '${{{0}'")]
    MissingBrace(String),
    /// `${}` or an unknown modifier such as `${x!}`.
    #[error("bad substitution: {0}")]
    BadSubstitution(String),
    /// `${name?message}` / `${name:?message}` on an unset (or empty) variable.
    #[error("{name}: {message}")]
    Required {
        /// The variable.
        name: String,
        /// The word after `?`, or a default text.
        message: String,
    },
}

/// Where variable values come from.
pub trait Lookup {
    /// The value of `name`, or `None` when it is not set.
    fn lookup(&self, name: &str) -> Option<&str>;
}

impl Lookup for HashMap<String, String> {
    fn lookup(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

impl Lookup for BTreeMap<String, String> {
    fn lookup(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

/// A list of `(name, value)` pairs; the last pair with a name wins.
impl Lookup for Vec<(String, String)> {
    fn lookup(&self, name: &str) -> Option<&str> {
        self.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// No variables at all.
impl Lookup for () {
    fn lookup(&self, _name: &str) -> Option<&str> {
        None
    }
}

/// Expands `s` as one word: variables replaced, quotes and escapes removed,
/// whitespace kept (Docker's `ProcessWord`, used for WORKDIR, USER, ENV
/// values, COPY paths, flags...).
pub fn expand_word(s: &str, env: &dyn Lookup, escape: char) -> Result<String, LexError> {
    let mut lx = Lexer::new(s, env, escape, false);
    let mut out = Out::default();
    lx.process(&[], &mut out)?;
    Ok(out.word)
}

/// Expands `s` and splits it into words at unquoted whitespace, including
/// whitespace that an unquoted variable's value brings (Docker's
/// `ProcessWords`). A quoted empty string (`""`) is a word of its own.
pub fn expand_words(s: &str, env: &dyn Lookup, escape: char) -> Result<Vec<String>, LexError> {
    let mut lx = Lexer::new(s, env, escape, false);
    let mut out = Out::default();
    lx.process(&[], &mut out)?;
    out.finish_word();
    Ok(out.words)
}

/// Expands variables in the body of a heredoc whose delimiter was not
/// quoted (COPY/ADD `<<EOF`): quotes stay as they are; the escape character
/// only escapes `$` and itself (as in a shell heredoc), anything else after
/// it is kept with it.
pub fn expand_heredoc(s: &str, env: &dyn Lookup, escape: char) -> Result<String, LexError> {
    let mut lx = Lexer::new(s, env, escape, true);
    let mut out = Out::default();
    lx.process(&[], &mut out)?;
    Ok(out.word)
}

/// Splits an instruction's arguments into words at unquoted whitespace, the
/// way Docker's parser does before substitution: quotes and escapes are
/// kept in the words (substitution removes them later). Inside single
/// quotes the escape character is an ordinary character; an escape
/// character at the very end is dropped; an unclosed quote runs to the end.
pub fn split_words(s: &str, escape: char) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if quote.is_none() && c.is_whitespace() {
            if in_word {
                words.push(std::mem::take(&mut word));
                in_word = false;
            }
            continue;
        }
        in_word = true;
        if c == escape && quote != Some('\'') {
            if let Some(&n) = chars.get(i) {
                word.push(c);
                word.push(n);
                i += 1;
            }
            continue;
        }
        match quote {
            Some(q) if c == q => quote = None,
            None if c == '\'' || c == '"' => quote = Some(c),
            _ => {}
        }
        word.push(c);
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Splits at whitespace only, ignoring quotes (Docker does this for COPY,
/// ADD, EXPOSE, VOLUME and FROM arguments that are not JSON).
pub fn split_whitespace(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// One result being built: the word as a whole and its split words.
#[derive(Debug, Default)]
struct Out {
    word: String,
    words: Vec<String>,
    cur: String,
    in_word: bool,
}

impl Out {
    /// A character that never splits (quoted or escaped).
    fn raw(&mut self, c: char) {
        self.word.push(c);
        self.cur.push(c);
        self.in_word = true;
    }

    fn raw_str(&mut self, s: &str) {
        for c in s.chars() {
            self.raw(c);
        }
    }

    /// An unquoted character: whitespace ends the current split word.
    fn plain(&mut self, c: char) {
        self.word.push(c);
        if c.is_whitespace() {
            self.finish_word();
        } else {
            self.cur.push(c);
            self.in_word = true;
        }
    }

    fn plain_str(&mut self, s: &str) {
        for c in s.chars() {
            self.plain(c);
        }
    }

    fn finish_word(&mut self) {
        if self.in_word {
            self.words.push(std::mem::take(&mut self.cur));
            self.in_word = false;
        }
    }
}

struct Lexer<'a> {
    chars: Vec<char>,
    pos: usize,
    env: &'a dyn Lookup,
    escape: char,
    heredoc: bool,
    /// `${...}` nesting depth (bounded, so deep input cannot exhaust the
    /// stack).
    depth: usize,
}

/// The deepest `${a:-${b:-...}}` nesting accepted.
const MAX_DEPTH: usize = 64;

impl<'a> Lexer<'a> {
    fn new(s: &str, env: &'a dyn Lookup, escape: char, heredoc: bool) -> Self {
        Lexer {
            chars: s.chars().collect(),
            pos: 0,
            env,
            escape,
            heredoc,
            depth: 0,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }

    /// Processes up to (not including) one of `stops`, or to the end when
    /// `stops` is empty.
    fn process(&mut self, stops: &[char], out: &mut Out) -> Result<(), LexError> {
        while let Some(c) = self.peek() {
            if stops.contains(&c) {
                return Ok(());
            }
            self.pos += 1;
            if self.heredoc {
                if c == '$' {
                    let v = self.dollar()?;
                    out.raw_str(&v);
                } else if c == self.escape {
                    match self.peek() {
                        Some(n) if n == '$' || n == self.escape => {
                            self.pos += 1;
                            out.raw(n);
                        }
                        _ => out.raw(c),
                    }
                } else {
                    out.raw(c);
                }
                continue;
            }
            match c {
                '\'' => {
                    out.in_word = true;
                    self.single_quoted(out)?;
                }
                '"' => {
                    out.in_word = true;
                    self.double_quoted(out)?;
                }
                '$' => {
                    let v = self.dollar()?;
                    out.plain_str(&v);
                }
                c if c == self.escape => {
                    if let Some(n) = self.next() {
                        out.raw(n);
                    }
                }
                c => out.plain(c),
            }
        }
        Ok(())
    }

    fn single_quoted(&mut self, out: &mut Out) -> Result<(), LexError> {
        loop {
            match self.next() {
                None => return Err(LexError::UnterminatedQuote("single")),
                Some('\'') => return Ok(()),
                Some(c) => out.raw(c),
            }
        }
    }

    fn double_quoted(&mut self, out: &mut Out) -> Result<(), LexError> {
        loop {
            match self.next() {
                None => return Err(LexError::UnterminatedQuote("double")),
                Some('"') => return Ok(()),
                Some('$') => {
                    let v = self.dollar()?;
                    out.raw_str(&v);
                }
                Some(c) if c == self.escape => match self.peek() {
                    Some(n) if n == '"' || n == '$' || n == self.escape => {
                        self.pos += 1;
                        out.raw(n);
                    }
                    Some(_) => out.raw(c),
                    None => {}
                },
                Some(c) => out.raw(c),
            }
        }
    }

    /// A variable name after `$` or `${`: digits, one special parameter,
    /// or letters, digits and `_`.
    fn name(&mut self) -> String {
        let mut name = String::new();
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                while let Some(d) = self.peek().filter(char::is_ascii_digit) {
                    name.push(d);
                    self.pos += 1;
                }
            }
            Some(c) if "@*#?-$!".contains(c) => {
                name.push(c);
                self.pos += 1;
            }
            _ => {
                while let Some(c) = self.peek().filter(|c| c.is_alphanumeric() || *c == '_') {
                    name.push(c);
                    self.pos += 1;
                }
            }
        }
        name
    }

    /// After a `$`: the value it stands for.
    fn dollar(&mut self) -> Result<String, LexError> {
        if self.peek() == Some('{') {
            self.pos += 1;
            return self.braced();
        }
        let name = self.name();
        if name.is_empty() {
            return Ok("$".to_owned());
        }
        Ok(self.env.lookup(&name).unwrap_or("").to_owned())
    }

    /// A nested word up to one of `stops` (not consumed); errors at the end.
    fn sub_word(&mut self, stops: &[char], name: &str) -> Result<String, LexError> {
        // A nested word is always processed as an ordinary word, even inside
        // a heredoc body.
        let heredoc = std::mem::replace(&mut self.heredoc, false);
        let mut out = Out::default();
        let r = self.process(stops, &mut out);
        self.heredoc = heredoc;
        r?;
        if self.peek().is_none() {
            return Err(LexError::MissingBrace(name.to_owned()));
        }
        Ok(out.word)
    }

    fn close(&mut self, name: &str) -> Result<(), LexError> {
        match self.next() {
            Some('}') => Ok(()),
            _ => Err(LexError::MissingBrace(name.to_owned())),
        }
    }

    fn braced(&mut self) -> Result<String, LexError> {
        if self.depth >= MAX_DEPTH {
            return Err(LexError::BadSubstitution(format!(
                "'${{' nested more than {MAX_DEPTH} deep"
            )));
        }
        self.depth += 1;
        let r = self.braced_inner();
        self.depth -= 1;
        r
    }

    fn braced_inner(&mut self) -> Result<String, LexError> {
        let name = self.name();
        if name.is_empty() {
            return match self.peek() {
                None => Err(LexError::MissingBrace(String::new())),
                Some(c) => Err(LexError::BadSubstitution(format!(
                    "'${{{c}': a variable name must come first"
                ))),
            };
        }
        let value = self.env.lookup(&name).map(str::to_owned);
        let Some(m) = self.next() else {
            return Err(LexError::MissingBrace(name));
        };
        match m {
            '}' => Ok(value.unwrap_or_default()),
            ':' => {
                let Some(op) = self.next() else {
                    return Err(LexError::MissingBrace(name));
                };
                if !matches!(op, '-' | '+' | '?') {
                    return Err(LexError::BadSubstitution(format!(
                        "unsupported modifier ':{op}' in '${{{name}'"
                    )));
                }
                let word = self.sub_word(&['}'], &name)?;
                self.close(&name)?;
                let set = value.as_deref().is_some_and(|v| !v.is_empty());
                apply_default(op, set, value, word, &name)
            }
            '-' | '+' | '?' => {
                let word = self.sub_word(&['}'], &name)?;
                self.close(&name)?;
                let set = value.is_some();
                apply_default(m, set, value, word, &name)
            }
            '#' | '%' => {
                let longest = self.peek() == Some(m);
                if longest {
                    self.pos += 1;
                }
                let pat = self.sub_word(&['}'], &name)?;
                self.close(&name)?;
                let v = value.unwrap_or_default();
                Ok(if m == '#' {
                    remove_prefix(&v, &pat, longest)
                } else {
                    remove_suffix(&v, &pat, longest)
                })
            }
            '/' => {
                let all = self.peek() == Some('/');
                if all {
                    self.pos += 1;
                }
                let pat = self.sub_word(&['/', '}'], &name)?;
                let rep = if self.peek() == Some('/') {
                    self.pos += 1;
                    self.sub_word(&['}'], &name)?
                } else {
                    String::new()
                };
                self.close(&name)?;
                Ok(replace(&value.unwrap_or_default(), &pat, &rep, all))
            }
            other => Err(LexError::BadSubstitution(format!(
                "unsupported modifier '{other}' in '${{{name}'"
            ))),
        }
    }
}

fn apply_default(
    op: char,
    set: bool,
    value: Option<String>,
    word: String,
    name: &str,
) -> Result<String, LexError> {
    match op {
        '-' => Ok(if set { value.unwrap_or_default() } else { word }),
        '+' => Ok(if set { word } else { String::new() }),
        _ => {
            if set {
                Ok(value.unwrap_or_default())
            } else {
                let message = if word.is_empty() {
                    "is not set (and is required)".to_owned()
                } else {
                    word
                };
                Err(LexError::Required {
                    name: name.to_owned(),
                    message,
                })
            }
        }
    }
}

fn remove_prefix(v: &str, pat: &str, longest: bool) -> String {
    let s: Vec<char> = v.chars().collect();
    let p: Vec<char> = pat.chars().collect();
    let mut cuts: Vec<usize> = (0..=s.len()).collect();
    if longest {
        cuts.reverse();
    }
    for i in cuts {
        if crate::glob::glob_match(&p, &s[..i]) {
            return s[i..].iter().collect();
        }
    }
    v.to_owned()
}

fn remove_suffix(v: &str, pat: &str, longest: bool) -> String {
    let s: Vec<char> = v.chars().collect();
    let p: Vec<char> = pat.chars().collect();
    let mut cuts: Vec<usize> = (0..=s.len()).collect();
    if !longest {
        cuts.reverse();
    }
    for i in cuts {
        if crate::glob::glob_match(&p, &s[i..]) {
            return s[..i].iter().collect();
        }
    }
    v.to_owned()
}

/// `${v/pat/rep}`: the longest match at the first position where one
/// starts; with `all`, every non-overlapping match from left to right.
fn replace(v: &str, pat: &str, rep: &str, all: bool) -> String {
    if pat.is_empty() {
        return v.to_owned();
    }
    let s: Vec<char> = v.chars().collect();
    let p: Vec<char> = pat.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let mut replaced = false;
    while i < s.len() {
        if !replaced || all {
            if let Some(j) = (i + 1..=s.len())
                .rev()
                .find(|&j| crate::glob::glob_match(&p, &s[i..j]))
            {
                out.push_str(rep);
                i = j;
                replaced = true;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Vec<(String, String)> {
        [
            ("foo", "/bar"),
            ("empty", ""),
            ("sp", "a b  c"),
            ("path", "/usr/local/lib/file.tar.gz"),
            ("x", "abcabc"),
            ("u", "ü1"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    /// Expands each input of `cases` with `expand` and `escape` against
    /// `env()`, asserting the wanted result.
    fn assert_expands(
        expand: fn(&str, &dyn Lookup, char) -> Result<String, LexError>,
        escape: char,
        cases: &[(&str, &str)],
    ) {
        let env = env();
        for (input, want) in cases {
            let got = expand(input, &env, escape);
            assert_eq!(got.as_deref(), Ok(*want), "input {input:?}");
        }
    }

    #[test]
    fn expand_word_table() {
        let cases: &[(&str, &str)] = &[
            ("plain", "plain"),
            ("$foo", "/bar"),
            ("${foo}", "/bar"),
            ("${foo}_x", "/bar_x"),
            ("$foo_x", ""),
            ("$foo/x", "/bar/x"),
            ("$nope", ""),
            ("${nope}", ""),
            ("a${nope}b", "ab"),
            ("\\$foo", "$foo"),
            ("\\${foo}", "${foo}"),
            ("'$foo'", "$foo"),
            ("\"$foo\"", "/bar"),
            ("\"a  b\"", "a  b"),
            ("a  b", "a  b"),
            ("'a\\b'", "a\\b"),
            ("\"a\\b\"", "a\\b"),
            ("\"a\\\"b\"", "a\"b"),
            ("\"\\$foo\"", "$foo"),
            ("\"a\\\\b\"", "a\\b"),
            ("a\\ b", "a b"),
            ("a\\", "a"),
            ("$", "$"),
            ("a$", "a$"),
            ("$ x", "$ x"),
            ("$/", "$/"),
            ("${foo:-w}", "/bar"),
            ("${nope:-w}", "w"),
            ("${empty:-w}", "w"),
            ("${empty-w}", ""),
            ("${nope-w}", "w"),
            ("${foo-w}", "/bar"),
            ("${foo:+w}", "w"),
            ("${nope:+w}", ""),
            ("${empty:+w}", ""),
            ("${empty+w}", "w"),
            ("${nope+w}", ""),
            ("${nope:-$foo}", "/bar"),
            ("${nope:-${foo}/x}", "/bar/x"),
            ("${nope:-\"a b\"}", "a b"),
            ("${nope:-'}'}", "}"),
            ("${nope:-a\\}b}", "a}b"),
            ("${nope:-}", ""),
            ("${foo:?boom}", "/bar"),
            ("${path#*/}", "usr/local/lib/file.tar.gz"),
            ("${path##*/}", "file.tar.gz"),
            ("${path%.*}", "/usr/local/lib/file.tar"),
            ("${path%%.*}", "/usr/local/lib/file"),
            ("${path#nomatch}", "/usr/local/lib/file.tar.gz"),
            ("${x/b/X}", "aXcabc"),
            ("${x//b/X}", "aXcaXc"),
            ("${x//b}", "acac"),
            ("${x/b*/X}", "aX"),
            ("${x/[bc]/-}", "a-cabc"),
            ("${x//[!a]/-}", "a--a--"),
            ("${nope#x}", ""),
            ("$u", "ü1"),
            ("$1", ""),
            ("$@x", "x"),
        ];
        assert_expands(expand_word, '\\', cases);
    }

    #[test]
    fn backtick_escape() {
        let cases: &[(&str, &str)] = &[
            ("`$foo", "$foo"),
            ("c:\\foo", "c:\\foo"),
            ("$foo\\x", "/bar\\x"),
            ("\"a`\"b\"", "a\"b"),
            ("a` b", "a b"),
        ];
        assert_expands(expand_word, '`', cases);
    }

    #[test]
    fn expand_word_errors() {
        let env = env();
        let cases: &[&str] = &[
            "'abc",
            "\"abc",
            "${foo",
            "${foo:-abc",
            "${}",
            "${",
            "${foo!}",
            "${foo:x}",
            "${nope:?}",
            "${nope?oops}",
            "${empty:?oops}",
            "${ foo}",
            "${x/b",
        ];
        for input in cases {
            assert!(
                expand_word(input, &env, '\\').is_err(),
                "input {input:?} should fail"
            );
        }
        assert_eq!(
            expand_word("${nope?must be set}", &env, '\\'),
            Err(LexError::Required {
                name: "nope".into(),
                message: "must be set".into()
            })
        );
        // `${empty?x}` only fails when unset, not when empty.
        assert_eq!(expand_word("${empty?x}", &env, '\\').as_deref(), Ok(""));
    }

    #[test]
    fn expand_words_table() {
        let env = env();
        let cases: &[(&str, &[&str])] = &[
            ("a b", &["a", "b"]),
            ("  a   b  ", &["a", "b"]),
            ("$sp", &["a", "b", "c"]),
            ("\"$sp\"", &["a b  c"]),
            ("x$sp", &["xa", "b", "c"]),
            ("'a b' c", &["a b", "c"]),
            ("a\\ b c", &["a b", "c"]),
            ("\"\" x", &["", "x"]),
            ("$nope x", &["x"]),
            ("", &[]),
            ("80/tcp 443", &["80/tcp", "443"]),
        ];
        for (input, want) in cases {
            let got = expand_words(input, &env, '\\').expect(input);
            assert_eq!(got, *want, "input {input:?}");
        }
    }

    #[test]
    fn heredoc_expansion() {
        let cases: &[(&str, &str)] = &[
            ("echo $foo\n", "echo /bar\n"),
            ("echo '$foo'\n", "echo '/bar'\n"),
            ("echo \"${foo}\"\n", "echo \"/bar\"\n"),
            ("a \\$foo\n", "a $foo\n"),
            ("printf 'a\\n'\n", "printf 'a\\n'\n"),
            ("a \\\\ b", "a \\ b"),
            ("${nope:-'x y'}", "x y"),
        ];
        assert_expands(expand_heredoc, '\\', cases);
    }

    #[test]
    fn split_words_table() {
        let cases: &[(&str, &[&str])] = &[
            ("a b", &["a", "b"]),
            ("a=\"x y\" b=1", &["a=\"x y\"", "b=1"]),
            ("a='x \\' b", &["a='x \\'", "b"]),
            ("a=x\\ y b", &["a=x\\ y", "b"]),
            ("a=\"x\\\" y\" b", &["a=\"x\\\" y\"", "b"]),
            ("a=\"unclosed b", &["a=\"unclosed b"]),
            ("x\\", &["x"]),
            ("", &[]),
            ("   ", &[]),
            ("\"\"", &["\"\""]),
        ];
        for (input, want) in cases {
            assert_eq!(split_words(input, '\\'), *want, "input {input:?}");
        }
        assert_eq!(split_words("a=x` y", '`'), ["a=x` y"]);
    }

    #[test]
    fn glob_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "a/b", true),
            ("a*c", "abbc", true),
            ("a*c", "abb", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("[a-c]x", "bx", true),
            ("[a-c]x", "dx", false),
            ("[!a-c]x", "dx", true),
            ("[^a-c]x", "ax", false),
            ("[]]", "]", true),
            ("[", "[", true),
            ("\\*", "*", true),
            ("\\*", "a", false),
            ("*.tar.gz", "x.tar.gz", true),
        ];
        for (p, s, want) in cases {
            let p: Vec<char> = p.chars().collect();
            let s: Vec<char> = s.chars().collect();
            assert_eq!(crate::glob::glob_match(&p, &s), *want, "{p:?} vs {s:?}");
        }
    }
}
