//! Shell patterns, one matcher for sifbox: `*` (any run of characters,
//! slashes too), `?` (one character), `[...]` (a class: `!` or `^` negates,
//! `a-z` ranges, a leading `]` is a member), `\x` (x literally). The
//! shell-word expansion's `${v#pat}`, `${v%pat}` and `${v/pat/rep}` use it,
//! and so does `sifbox eval --filter`. (`.dockerignore` keeps Go's
//! `filepath.Match` semantics, in [`crate::ignore`].)

/// Checks that `pattern` is well formed: every class closed, no trailing
/// backslash.
pub fn check(pattern: &str) -> Result<(), String> {
    let p: Vec<char> = pattern.chars().collect();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '[' => match match_class(&p, i, '\0') {
                Some((_, next)) => i = next,
                None => return Err(format!("unclosed [ in {pattern:?}")),
            },
            '\\' if i + 1 == p.len() => return Err(format!("trailing \\ in {pattern:?}")),
            '\\' => i += 2,
            _ => i += 1,
        }
    }
    Ok(())
}

/// Whether `name` matches `pattern` as a whole.
pub fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    glob_match(&p, &n)
}

/// Shell pattern matching for the `#`, `%` and `/` modifiers: `*` matches
/// any string (slashes too), `?` one character, `[...]` a class (`!` or
/// `^` negates, `a-z` ranges), `\` makes the next character literal.
pub(crate) fn glob_match(p: &[char], s: &[char]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, si));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                '[' => {
                    if let Some((ok, next)) = match_class(p, pi, s[si]) {
                        if ok {
                            pi = next;
                            si += 1;
                            continue;
                        }
                    } else if s[si] == '[' {
                        pi += 1;
                        si += 1;
                        continue;
                    }
                }
                '\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == s[si] {
                        pi += 2;
                        si += 1;
                        continue;
                    }
                }
                c => {
                    if c == s[si] {
                        pi += 1;
                        si += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, ss)) => {
                pi = sp + 1;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `p[start] == '['`; returns
/// whether it matched and the index after `]`, or `None` when the class is
/// not closed (then `[` is literal).
fn match_class(p: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some('!' | '^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let lo = *p.get(i)?;
        if lo == ']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        let lo = if lo == '\\' {
            i += 1;
            *p.get(i)?
        } else {
            lo
        };
        i += 1;
        if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|&h| h != ']') {
            let mut hi = p[i + 1];
            i += 2;
            if hi == '\\' {
                hi = *p.get(i)?;
                i += 1;
            }
            if lo <= c && c <= hi {
                matched = true;
            }
        } else if lo == c {
            matched = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(matches("*", ""));
        assert!(matches("*", "anything"));
        assert!(matches("hello-*", "hello-world"));
        assert!(!matches("hello-*", "hello"));
        assert!(matches("*-net*", "no-network"));
        assert!(matches("t?sk", "task"));
        assert!(!matches("t?sk", "tsk"));
        assert!(matches("[a-c]x", "bx"));
        assert!(!matches("[!a-c]x", "bx"));
        assert!(matches("[^a-c]x", "dx"));
        assert!(matches("[]]", "]"));
        assert!(matches("a\\*", "a*"));
        assert!(!matches("a\\*", "ab"));
        assert!(matches("*a*b*c*", "xxaxxbxxcxx"));
        assert!(!matches("*a*b*c*", "xxaxxcxxbxx"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
        // An unclosed class is a literal `[`.
        assert!(matches("[ab", "[ab"));
    }

    #[test]
    fn well_formed() {
        assert!(check("a*[bc]?").is_ok());
        assert!(check("[]]").is_ok());
        assert!(check("[abc").is_err());
        assert!(check("abc\\").is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics(p in ".{0,20}", n in ".{0,20}") {
            let _ = check(&p);
            let _ = matches(&p, &n);
        }

        #[test]
        fn a_name_matches_itself_escaped(n in "[a-z0-9*?\\[\\]._-]{0,20}") {
            let escaped: String = n.chars().flat_map(|c| ['\\', c]).collect();
            proptest::prop_assert!(matches(&escaped, &n));
        }
    }
}
