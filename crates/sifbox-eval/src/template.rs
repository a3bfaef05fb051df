//! `${VAR}` and `${VAR:-default}` in task.toml env values, resolved from
//! the host's environment when a job starts.
//!
//! `${VAR}` is VAR's value (an error when VAR is unset); `${VAR:-default}`
//! is the default when VAR is unset or empty; `${VAR-default}` only when it
//! is unset. `$$` is a literal `$`; any other `$` is kept as it is. The
//! default is literal text (no nesting).

/// Looks a variable up (the host's environment, in a job).
pub type Lookup<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// Resolves the template `s`, looking variables up with `lookup`.
pub fn resolve(s: &str, lookup: &Lookup<'_>) -> Result<String, String> {
    expand(s, Some(lookup))
}

/// Checks the syntax of `s` without resolving anything.
pub fn check(s: &str) -> Result<(), String> {
    expand(s, None).map(drop)
}

fn expand(s: &str, lookup: Option<&Lookup<'_>>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let Some(body_and_tail) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let end = body_and_tail
            .find('}')
            .ok_or_else(|| format!("unterminated ${{ in {s:?}"))?;
        let body = &body_and_tail[..end];
        rest = &body_and_tail[end + 1..];
        let name_len = body
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or(body.len());
        let (name, op) = body.split_at(name_len);
        if !is_var_name(name) {
            return Err(format!(
                "${{{body}}} in {s:?}: expected ${{NAME}} or ${{NAME:-default}}"
            ));
        }
        let (default, empty_counts) = if let Some(d) = op.strip_prefix(":-") {
            (Some(d), true)
        } else if let Some(d) = op.strip_prefix('-') {
            (Some(d), false)
        } else if op.is_empty() {
            (None, false)
        } else {
            return Err(format!(
                "${{{body}}} in {s:?}: expected ${{NAME}} or ${{NAME:-default}}"
            ));
        };
        let Some(lookup) = lookup else {
            continue;
        };
        let value = lookup(name).filter(|v| !(empty_counts && v.is_empty()));
        match (value, default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                return Err(format!(
                "${{{name}}} is not set for the task (only variables passed with --pass-env are)"
            ))
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether `s` is a valid environment variable name.
pub fn is_var_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn variables_and_defaults() {
        let r = |s: &str| resolve(s, &env);
        assert_eq!(r("plain").as_deref(), Ok("plain"));
        assert_eq!(r("${HOME}/x").as_deref(), Ok("/home/u/x"));
        assert_eq!(r("${NOPE:-dflt}").as_deref(), Ok("dflt"));
        assert_eq!(r("${EMPTY:-dflt}").as_deref(), Ok("dflt"));
        assert_eq!(r("${EMPTY-dflt}").as_deref(), Ok(""));
        assert_eq!(r("${NOPE-a b}").as_deref(), Ok("a b"));
        assert_eq!(r("${HOME:-x}").as_deref(), Ok("/home/u"));
        assert_eq!(r("$$HOME $HOME $").as_deref(), Ok("$HOME $HOME $"));
        assert_eq!(r("a${NOPE:-}b").as_deref(), Ok("ab"));
    }

    #[test]
    fn errors_name_the_problem() {
        let e = resolve("${NOPE}", &env).expect_err("unset");
        assert!(e.contains("NOPE") && e.contains("not set"), "{e}");
        assert!(check("${UNCLOSED")
            .expect_err("open")
            .contains("unterminated"));
        assert!(check("${1X}").is_err());
        assert!(check("${A:?x}").is_err());
        assert!(check("${}").is_err());
        assert!(check("${A:-x} ${B} $C").is_ok());
    }
}
