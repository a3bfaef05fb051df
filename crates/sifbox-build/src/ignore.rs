//! `.dockerignore` with Docker's semantics (not gitignore's):
//!
//! - a line starting with `#` in column 1 is a comment; other lines are
//!   trimmed, blank ones skipped; `!` at the start makes an exception;
//! - each pattern is cleaned like Go's `filepath.Clean` (`.`/`..` elements
//!   resolved, duplicate and trailing slashes removed) and a leading `/` is
//!   dropped: every pattern is anchored at the context root (`foo` means
//!   `./foo` only); the pattern `.` is ignored, as Docker does;
//! - the syntax is Go's `filepath.Match` (`*` any run of non-`/`, `?` one
//!   non-`/` character, `[...]` a class with `^` negation and ranges, `\`
//!   escapes) plus `**`, any number of directories (zero included);
//! - a pattern that matches a directory also matches everything below it;
//! - the last pattern that matches a path decides; an exception can
//!   re-include a path below an excluded directory, so a walker must look
//!   inside an excluded directory when [`Ignore::may_reinclude_below`] says
//!   so.
//!
//! Docker sends the Dockerfile and `.dockerignore` to the builder even when
//! they are excluded, but COPY/ADD do not see them then; nothing here treats
//! them specially.

use std::io;
use std::path::{Path, PathBuf};

/// A pattern that is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(".dockerignore:{line}: bad pattern {pattern:?}: {message}")]
pub struct IgnoreError {
    /// 1-based line.
    pub line: usize,
    /// The line as written (trimmed).
    pub pattern: String,
    /// What is wrong.
    pub message: String,
}

/// A parsed `.dockerignore`.
#[derive(Debug, Clone, Default)]
pub struct Ignore {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    /// The cleaned pattern, without `!`.
    text: String,
    exception: bool,
    tokens: Vec<Tok>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(char),
    /// `?`: one character but `/`.
    Any,
    /// `[...]`.
    Class {
        negate: bool,
        ranges: Vec<(char, char)>,
    },
    /// `*`: a run of characters but `/`.
    Star,
    /// `**` at the end: anything.
    AnyString,
    /// `**` (with its `/`) before more pattern: zero or more whole
    /// directories (`(.*/)?`).
    Dirs,
}

impl Ignore {
    /// Parses the text of a `.dockerignore` (a UTF-8 BOM at the start is
    /// skipped).
    pub fn parse(text: &str) -> Result<Ignore, IgnoreError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut patterns = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.starts_with('#') {
                continue;
            }
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let (exception, body) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            let bad = |message: &str| IgnoreError {
                line: i + 1,
                pattern: line.to_owned(),
                message: message.to_owned(),
            };
            if body.is_empty() {
                return Err(bad("an exception (!) needs a pattern after it"));
            }
            let mut cleaned = clean(body);
            if cleaned.len() > 1 {
                if let Some(rest) = cleaned.strip_prefix('/') {
                    cleaned = rest.to_owned();
                }
            }
            if cleaned == "." {
                continue;
            }
            let tokens = compile(&cleaned, true).map_err(|m| bad(&m))?;
            patterns.push(Pattern {
                text: cleaned,
                exception,
                tokens,
            });
        }
        Ok(Ignore { patterns })
    }

    /// Whether there are no patterns.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The cleaned patterns, `!` kept, in order.
    pub fn patterns(&self) -> Vec<String> {
        self.patterns
            .iter()
            .map(|p| {
                if p.exception {
                    format!("!{}", p.text)
                } else {
                    p.text.clone()
                }
            })
            .collect()
    }

    /// Whether `rel_path` (relative to the context root, `/`-separated) is
    /// excluded: the last pattern that matches it or one of its parent
    /// directories decides. `is_dir` does not change the answer (Docker's
    /// patterns do not tell directories from files: `foo/` is `foo`); it is
    /// taken so that callers say what they have.
    pub fn is_excluded(&self, rel_path: &str, is_dir: bool) -> bool {
        let _ = is_dir;
        let path = clean(rel_path);
        let path = path.trim_start_matches('/');
        if path.is_empty() || path == "." {
            return false;
        }
        let s: Vec<char> = path.chars().collect();
        let mut excluded = false;
        for p in &self.patterns {
            // Only a pattern that could change the answer is tried.
            if p.exception != excluded {
                continue;
            }
            if matches_self_or_parent(&p.tokens, &s) {
                excluded = !p.exception;
            }
        }
        excluded
    }

    /// Whether something below the directory `rel_dir` could be included
    /// even though the directory itself is excluded: true when an exception
    /// could match a path below it (or matches it or a parent). A walker
    /// skips an excluded directory only when this is false.
    pub fn may_reinclude_below(&self, rel_dir: &str) -> bool {
        let dir = clean(rel_dir);
        let dir = dir.trim_start_matches('/');
        let mut prefix: Vec<char> = if dir == "." || dir.is_empty() {
            Vec::new()
        } else {
            dir.chars().collect()
        };
        let as_dir = prefix.clone();
        if !prefix.is_empty() {
            prefix.push('/');
        }
        self.patterns.iter().filter(|p| p.exception).any(|p| {
            (!as_dir.is_empty() && matches_self_or_parent(&p.tokens, &as_dir))
                || can_match_with_prefix(&p.tokens, &prefix)
        })
    }
}

/// Go's `filepath.Match` for one name (no `**`): `*`, `?`, `[...]` (with
/// `^` negation), `\` escapes. A malformed pattern matches nothing.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    match compile(pattern, false) {
        Ok(tokens) => {
            let s: Vec<char> = name.chars().collect();
            full_match(&tokens, &s)
        }
        Err(_) => false,
    }
}

/// Whether `pattern` is a malformed `filepath.Match` pattern.
pub fn glob_is_valid(pattern: &str) -> bool {
    compile(pattern, false).is_ok()
}

/// Go's `filepath.Clean` for `/`-separated paths.
pub fn clean(p: &str) -> String {
    if p.is_empty() {
        return ".".to_owned();
    }
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            c => parts.push(c),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    }
}

fn compile(p: &str, double_star: bool) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = p.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            '*' if double_star && chars.get(i) == Some(&'*') => {
                i += 1;
                if chars.get(i) == Some(&'/') {
                    i += 1;
                }
                if i >= chars.len() {
                    toks.push(Tok::AnyString);
                } else {
                    toks.push(Tok::Dirs);
                }
            }
            '*' => {
                if toks.last() != Some(&Tok::Star) {
                    toks.push(Tok::Star);
                }
            }
            '?' => toks.push(Tok::Any),
            '\\' => match chars.get(i) {
                Some(&n) => {
                    toks.push(Tok::Lit(n));
                    i += 1;
                }
                None => return Err("a trailing \\ escapes nothing".to_owned()),
            },
            '[' => {
                let (tok, next) = class(&chars, i)?;
                toks.push(tok);
                i = next;
            }
            c => toks.push(Tok::Lit(c)),
        }
    }
    Ok(toks)
}

/// Parses a class whose `[` is just before `chars[i]`.
fn class(chars: &[char], mut i: usize) -> Result<(Tok, usize), String> {
    let unclosed = || "a [ is never closed by ]".to_owned();
    let negate = chars.get(i) == Some(&'^');
    if negate {
        i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        let c = *chars.get(i).ok_or_else(unclosed)?;
        if c == ']' && !ranges.is_empty() {
            return Ok((Tok::Class { negate, ranges }, i + 1));
        }
        if c == ']' {
            return Err("a character class must not be empty".to_owned());
        }
        let mut lo = c;
        i += 1;
        if lo == '\\' {
            lo = *chars.get(i).ok_or_else(unclosed)?;
            i += 1;
        }
        let mut hi = lo;
        if chars.get(i) == Some(&'-') {
            i += 1;
            let mut h = *chars.get(i).ok_or_else(unclosed)?;
            if h == ']' {
                return Err("a range in a character class has no end".to_owned());
            }
            i += 1;
            if h == '\\' {
                h = *chars.get(i).ok_or_else(unclosed)?;
                i += 1;
            }
            if h < lo {
                return Err(format!("the range {lo}-{h} is backwards"));
            }
            hi = h;
        }
        ranges.push((lo, hi));
    }
}

fn tok_char(t: &Tok, c: char) -> bool {
    match t {
        Tok::Lit(l) => *l == c,
        Tok::Any => c != '/',
        Tok::Class { negate, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negate
        }
        _ => false,
    }
}

/// `dp[i][j]`: whether `t[i..]` matches `s[j..]`; with `open_end`, the end
/// of `s` accepts any remaining pattern (something may follow).
fn table(t: &[Tok], s: &[char], open_end: bool) -> Vec<Vec<bool>> {
    let (n, m) = (t.len(), s.len());
    let mut dp = vec![vec![false; m + 1]; n + 1];
    dp[n][m] = true;
    if open_end {
        for row in dp.iter_mut() {
            row[m] = true;
        }
    }
    for i in (0..n).rev() {
        // For Dirs: whether some k >= j has s[k] == '/' and dp[i+1][k+1].
        let mut slash_ok = false;
        for j in (0..=m).rev() {
            if open_end && j == m {
                // Already true: what follows can complete the pattern.
                continue;
            }
            let v = match &t[i] {
                Tok::Star => dp[i + 1][j] || (j < m && s[j] != '/' && dp[i][j + 1]),
                Tok::AnyString => dp[i + 1][j] || (j < m && dp[i][j + 1]),
                Tok::Dirs => {
                    if j < m && s[j] == '/' && dp[i + 1][j + 1] {
                        slash_ok = true;
                    }
                    dp[i + 1][j] || slash_ok
                }
                tok => j < m && tok_char(tok, s[j]) && dp[i + 1][j + 1],
            };
            dp[i][j] = v;
        }
    }
    dp
}

fn full_match(t: &[Tok], s: &[char]) -> bool {
    table(t, s, false)[0][0]
}

/// Matches `s` or one of its parent directories (`a`, `a/b` for `a/b/c`).
fn matches_self_or_parent(t: &[Tok], s: &[char]) -> bool {
    let dp = table(t, s, false);
    if dp[0][0] {
        return true;
    }
    // A parent `s[..k]` (k at a '/') matches when t matches exactly s[..k]:
    // compute on the prefix.
    s.iter()
        .enumerate()
        .any(|(k, &c)| c == '/' && k > 0 && full_match(t, &s[..k]))
}

/// Whether `t` can match some string that starts with `prefix`.
fn can_match_with_prefix(t: &[Tok], prefix: &[char]) -> bool {
    table(t, prefix, true)[0][0]
}

/// What a walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// One included entry of a context walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkEntry {
    /// Relative to the context root, `/`-separated (lossy for names that
    /// are not UTF-8).
    pub rel: String,
    /// The same, as a path.
    pub path: PathBuf,
    /// What it is.
    pub kind: EntryKind,
    /// True for an excluded directory listed only because an exception
    /// includes something below it.
    pub implied: bool,
}

/// Walks the context directory `root` (not following symlinks, through
/// directory fds: see [`crate::tree`]), in lexical order with each
/// directory before its contents, and returns the entries `ignore` keeps.
/// An excluded directory is entered only when an exception may include
/// something below it, and is then listed (as `implied`) only if something
/// below it is.
pub fn walk(root: &Path, ignore: &Ignore) -> io::Result<Vec<WalkEntry>> {
    let tree = crate::tree::Tree::open(root)?;
    let mut out = Vec::new();
    walk_dir(&tree, &tree.root()?, ignore, &mut out)?;
    Ok(out)
}

fn walk_dir(
    tree: &crate::tree::Tree,
    dir: &crate::tree::Node,
    ignore: &Ignore,
    out: &mut Vec<WalkEntry>,
) -> io::Result<()> {
    use rustix::fs::FileType;
    for name in tree.list(dir)? {
        let node = tree.child(dir, &name)?;
        let kind = match node.file_type() {
            FileType::Directory => EntryKind::Dir,
            FileType::RegularFile => EntryKind::File,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        };
        let rel_str = node.rel.clone();
        let path = PathBuf::from(&rel_str);
        let is_dir = kind == EntryKind::Dir;
        let excluded = ignore.is_excluded(&rel_str, is_dir);
        if !excluded {
            out.push(WalkEntry {
                rel: rel_str,
                path,
                kind,
                implied: false,
            });
            if is_dir {
                walk_dir(tree, &node, ignore, out)?;
            }
        } else if is_dir && ignore.may_reinclude_below(&rel_str) {
            let mut inner = Vec::new();
            walk_dir(tree, &node, ignore, &mut inner)?;
            if !inner.is_empty() {
                out.push(WalkEntry {
                    rel: rel_str,
                    path,
                    kind,
                    implied: true,
                });
                out.extend(inner);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_table() {
        let cases: &[(&str, &str)] = &[
            ("", "."),
            (".", "."),
            ("a", "a"),
            ("a/", "a"),
            ("/a/", "/a"),
            ("a//b", "a/b"),
            ("./a/./b/", "a/b"),
            ("a/../b", "b"),
            ("a/..", "."),
            ("../a", "../a"),
            ("/../a", "/a"),
            ("a/b/../../..", ".."),
            ("/", "/"),
            ("//", "/"),
            ("**/*.go", "**/*.go"),
        ];
        for (i, want) in cases {
            assert_eq!(clean(i), *want, "{i:?}");
        }
    }

    /// (patterns, path, excluded?) for Docker's documented semantics.
    #[test]
    fn exclusion_table() {
        let cases: &[(&str, &str, bool)] = &[
            // Anchored at the root: not gitignore's "anywhere".
            ("foo", "foo", true),
            ("foo", "a/foo", false),
            ("foo", "foobar", false),
            ("/foo", "foo", true),
            ("./foo", "foo", true),
            ("foo/", "foo", true),
            ("foo/./bar/../baz", "foo/baz", true),
            // A match on a directory excludes what is below it.
            ("foo", "foo/bar/baz.txt", true),
            ("foo/bar", "foo/bar/x", true),
            ("foo/bar", "foo", false),
            // `*` does not cross `/`.
            ("*.md", "README.md", true),
            ("*.md", "docs/README.md", false),
            ("*/*.md", "docs/README.md", true),
            ("*/*.md", "a/b/README.md", false),
            ("*/temp*", "somedir/temporary.txt", true),
            ("*/temp*", "somedir/temp", true),
            ("*/temp*", "temp", false),
            ("*/*/temp*", "somedir/subdir/temporary.txt", true),
            ("*", "anything", true),
            ("*", "a/b/c", true),
            // `?`
            ("temp?", "tempa", true),
            ("temp?", "temp", false),
            ("temp?", "tempab", false),
            ("temp?", "tempa/x", true),
            ("a?b", "a/b", false),
            // `**`: any number of directories, zero included.
            ("**/*.go", "main.go", true),
            ("**/*.go", "a/b/c.go", true),
            ("**/*.go", "a/b/c.go.txt", false),
            ("**/*.go", "xgo", false),
            ("a/**/b", "a/b", true),
            ("a/**/b", "a/x/y/b", true),
            ("a/**/b", "a/x/y/c", false),
            ("a/**", "a/x/y", true),
            ("a/**", "a", false),
            ("**", "anything/at/all", true),
            ("**/node_modules", "node_modules", true),
            ("**/node_modules", "web/node_modules/x/y.js", true),
            ("**/node_modules", "web/node_modules_old", false),
            // Classes and escapes.
            ("[abc].txt", "b.txt", true),
            ("[abc].txt", "d.txt", false),
            ("[a-c].txt", "c.txt", true),
            ("[^a-c].txt", "d.txt", true),
            ("[^a-c].txt", "a.txt", false),
            ("[!a].txt", "!.txt", true),
            ("[!a].txt", "b.txt", false),
            ("\\*.txt", "*.txt", true),
            ("\\*.txt", "a.txt", false),
            ("a\\?", "a?", true),
            ("a\\?", "ab", false),
            ("[\\]]", "]", true),
            // Regexp characters are literal.
            ("a.b", "axb", false),
            ("a+b", "a+b", true),
            ("(a)", "(a)", true),
            ("a$", "a$", true),
            ("{a,b}", "a", false),
            // Whitespace and comments.
            ("  foo  ", "foo", true),
            ("# foo", "# foo", false),
            ("# foo", "foo", false),
            (" # foo", "# foo", true),
            ("\n\nfoo\n\n", "foo", true),
            // `.` is ignored; `..` patterns match nothing in the context.
            (".", "foo", false),
            ("../foo", "foo", false),
            // Last match wins; exceptions.
            ("*.md\n!README.md", "README.md", false),
            ("*.md\n!README.md", "CHANGES.md", true),
            (
                "*.md\n!README*.md\nREADME-secret.md",
                "README-secret.md",
                true,
            ),
            (
                "*.md\n!README*.md\nREADME-secret.md",
                "README-public.md",
                false,
            ),
            ("!README.md\n*.md", "README.md", true),
            ("*\n!src", "src/main.rs", false),
            ("*\n!src", "target/x", true),
            ("*\n!src\nsrc/gen", "src/gen/x.rs", true),
            ("docs\n!docs/keep.md", "docs/keep.md", false),
            ("docs\n!docs/keep.md", "docs", true),
            ("docs\n!docs/keep.md", "docs/other.md", true),
            ("docs\n! docs/keep.md", "docs/keep.md", false),
            ("**/*.pyc\n!keep/**", "keep/a/b.pyc", false),
            ("**/*.pyc\n!keep/**", "other/b.pyc", true),
            (
                "node_modules\n!node_modules/pkg/dist",
                "node_modules/pkg/dist/a.js",
                false,
            ),
            (
                "node_modules\n!node_modules/pkg/dist",
                "node_modules/pkg/src/a.js",
                true,
            ),
            // The Dockerfile and .dockerignore are ordinary paths here.
            ("Dockerfile\n.dockerignore", "Dockerfile", true),
            ("Dockerfile\n.dockerignore", ".dockerignore", true),
            // The root is never excluded.
            ("*", "", false),
            ("*", ".", false),
            // Paths are cleaned too.
            ("foo", "./foo", true),
            ("foo", "/foo", true),
            ("foo/bar", "foo//bar", true),
            // CRLF and a BOM.
            ("\u{feff}foo\r\nbar\r\n", "bar", true),
            ("\u{feff}foo\r\nbar\r\n", "foo", true),
        ];
        for (text, path, want) in cases {
            let ig = Ignore::parse(text).expect(text);
            assert_eq!(
                ig.is_excluded(path, false),
                *want,
                "patterns {text:?}, path {path:?}"
            );
        }
    }

    #[test]
    fn reinclude_below() {
        let cases: &[(&str, &str, bool)] = &[
            ("docs", "docs", false),
            ("docs\n!docs/keep.md", "docs", true),
            ("docs\n!docs/keep.md", "other", false),
            ("docs\n!docs/*/keep.md", "docs/a", true),
            ("docs\n!docs/*/keep.md", "docs/a/b", false),
            ("*\n!**/*.rs", "any/dir", true),
            ("*\n!*.rs", "src", false),
            ("*\n!src", "src", true),
            ("a\n!a", "a/b", true),
            ("a/b\n!a/[bc]/x", "a/b", true),
            ("a/b\n!a/[cd]/x", "a/b", false),
            ("x\n!x?/y", "xz", true),
        ];
        for (text, dir, want) in cases {
            let ig = Ignore::parse(text).expect(text);
            assert_eq!(
                ig.may_reinclude_below(dir),
                *want,
                "patterns {text:?}, dir {dir:?}"
            );
        }
    }

    #[test]
    fn bad_patterns() {
        let cases: &[(&str, usize)] = &[
            ("!", 1),
            ("ok\n  !  \n", 2),
            ("[abc", 1),
            ("a\n[]\n", 2),
            ("[z-a]", 1),
            ("[a-]", 1),
            ("foo\\", 1),
        ];
        for (text, line) in cases {
            let e = Ignore::parse(text).expect_err(text);
            assert_eq!(e.line, *line, "{text:?}");
        }
        let e = Ignore::parse("x\n[abc\n").expect_err("bad");
        assert_eq!(
            e.to_string(),
            ".dockerignore:2: bad pattern \"[abc\": a [ is never closed by ]"
        );
    }

    #[test]
    fn glob_match_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "abc", true),
            ("*", "a/b", false),
            ("*.txt", "a.txt", true),
            ("a?c", "abc", true),
            ("[^a]bc", "xbc", true),
            ("[^a]bc", "abc", false),
            ("**", "abc", true),
            ("\\[x", "[x", true),
            ("[x", "[x", false),
            ("", "", true),
            ("", "a", false),
        ];
        for (p, n, want) in cases {
            assert_eq!(glob_match(p, n), *want, "{p:?} vs {n:?}");
        }
        assert!(!glob_is_valid("[x"));
        assert!(glob_is_valid("a*"));
    }

    #[test]
    fn walk_context() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for f in [
            "Dockerfile",
            ".dockerignore",
            "README.md",
            "NOTES.md",
            "src/main.rs",
            "src/gen/out.rs",
            "docs/a.md",
            "docs/keep/x.md",
            "node_modules/p/i.js",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, "x").expect("write");
        }
        std::os::unix::fs::symlink("src", root.join("link")).expect("symlink");
        let ig = Ignore::parse(
            "# comment\n*.md\n!README.md\nnode_modules\nsrc/gen\ndocs\n!docs/keep\n.dockerignore\n",
        )
        .expect("parse");
        let got: Vec<(String, EntryKind, bool)> = walk(root, &ig)
            .expect("walk")
            .into_iter()
            .map(|e| (e.rel, e.kind, e.implied))
            .collect();
        let want: Vec<(String, EntryKind, bool)> = [
            ("Dockerfile", EntryKind::File, false),
            ("README.md", EntryKind::File, false),
            ("docs", EntryKind::Dir, true),
            ("docs/keep", EntryKind::Dir, false),
            ("docs/keep/x.md", EntryKind::File, false),
            ("link", EntryKind::Symlink, false),
            ("src", EntryKind::Dir, false),
            ("src/main.rs", EntryKind::File, false),
        ]
        .iter()
        .map(|(r, k, i)| ((*r).to_owned(), *k, *i))
        .collect();
        assert_eq!(got, want);
    }
}
