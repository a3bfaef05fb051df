//! Shell-style patterns for `--filter`: `*` (any run of characters), `?`
//! (one character), `[abc]`, `[a-z]`, `[!abc]` or `[^abc]` (one character
//! of, or not of, a set), `\x` (x literally).

/// Checks that `pattern` is well formed.
pub fn check(pattern: &str) -> Result<(), String> {
    let p: Vec<char> = pattern.chars().collect();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '[' => match class_end(&p, i) {
                Some(end) => i = end + 1,
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
    // Iterative matching with one backtrack point (the last `*`): linear
    // in practice, never exponential.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ni));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                '[' => {
                    if let Some(end) = class_end(&p, pi) {
                        if class_matches(&p[pi + 1..end], n[ni]) {
                            pi = end + 1;
                            ni += 1;
                            continue;
                        }
                    } else if n[ni] == '[' {
                        pi += 1;
                        ni += 1;
                        continue;
                    }
                }
                '\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == n[ni] {
                        pi += 2;
                        ni += 1;
                        continue;
                    }
                }
                c => {
                    if c == n[ni] {
                        pi += 1;
                        ni += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, sn)) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The index of the `]` closing the class that opens at `p[open]`.
fn class_end(p: &[char], open: usize) -> Option<usize> {
    let mut i = open + 1;
    if matches!(p.get(i), Some('!' | '^')) {
        i += 1;
    }
    // A `]` right at the start is a member.
    if p.get(i) == Some(&']') {
        i += 1;
    }
    while i < p.len() {
        if p[i] == ']' {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn class_matches(class: &[char], c: char) -> bool {
    let (negate, set) = match class.first() {
        Some('!' | '^') => (true, &class[1..]),
        _ => (false, class),
    };
    let mut hit = false;
    let mut i = 0;
    while i < set.len() {
        if i + 2 < set.len() && set[i + 1] == '-' {
            if set[i] <= c && c <= set[i + 2] {
                hit = true;
            }
            i += 3;
        } else {
            if set[i] == c {
                hit = true;
            }
            i += 1;
        }
    }
    hit != negate
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
    }

    #[test]
    fn well_formed() {
        assert!(check("a*[bc]?").is_ok());
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
