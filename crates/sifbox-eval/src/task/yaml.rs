//! YAML as task.md's front matter and compose files hold it: parsed with
//! `serde_yaml_ng` into a plain value, converted into the TOML value the
//! task.toml parser checks (so both formats go through one set of checks),
//! and the line of a key found again for errors.

use serde_yaml_ng::Value;

/// Parses `text` as one YAML document; `first_line` is the line of the
/// file `text` starts on (1-based). An error is `(line, message)`, the
/// message on one line.
pub(super) fn parse(text: &str, first_line: usize) -> Result<Value, (usize, String)> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_yaml_ng::from_str::<Value>(text).map_err(|e| {
        let line = e
            .location()
            .map_or(first_line, |l| first_line + l.line() - 1);
        (line, one_line(&e.to_string()))
    })
}

/// `msg` without its " at line N column M" (the caller cites the line)
/// and on one line.
pub(super) fn one_line(msg: &str) -> String {
    let msg = match msg.find(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    };
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A mapping key as a string: strings as they are, numbers and booleans
/// as YAML writes them; None for anything else (a null, a list).
pub(super) fn key_str(k: &Value) -> Option<String> {
    match k {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A short name of a value's type, for messages.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// The TOML value of a YAML value: a null in a mapping is left out (as
/// BenchFlow's models read a null as "not given"); a null in a list, or a
/// key that is not a scalar, is an error naming the key's path.
pub(super) fn to_toml(v: &Value, path: &str) -> Result<Option<toml::Value>, String> {
    Ok(Some(match v {
        Value::Null => return Ok(None),
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                toml::Value::Integer(i)
            } else if let Some(f) = n.as_f64() {
                toml::Value::Float(f)
            } else {
                return Err(format!("{path}: the number {n} is out of range"));
            }
        }
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match to_toml(item, &format!("{path}[{i}]"))? {
                    Some(x) => out.push(x),
                    None => return Err(format!("{path}[{i}]: null in a list")),
                }
            }
            toml::Value::Array(out)
        }
        Value::Mapping(m) => {
            let mut t = toml::Table::new();
            for (k, item) in m {
                let Some(k) = key_str(k) else {
                    return Err(format!("{path}: a key that is {}", kind(k)));
                };
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if let Some(x) = to_toml(item, &sub)? {
                    t.insert(k, x);
                }
            }
            toml::Value::Table(t)
        }
        Value::Tagged(t) => return to_toml(&t.value, path),
    }))
}

/// The line (1-based, of the file: `text` starts on `first_line`) where
/// the key at `path` (`a.b[0].c`) is written, as far as it can be found
/// by looking for each key at the start of a later line; else the line of
/// the last key found, else `first_line`.
pub(super) fn line_of(text: &str, first_line: usize, path: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut at = 0usize;
    let mut found = None;
    for key in path.split('.').map(|k| k.split('[').next().unwrap_or(k)) {
        if key.is_empty() {
            continue;
        }
        let hit = (at..lines.len()).find(|&i| {
            let l = lines[i].trim_start().trim_start_matches("- ").trim_start();
            [key.to_string(), format!("\"{key}\""), format!("'{key}'")]
                .iter()
                .any(|k| {
                    l.strip_prefix(k.as_str())
                        .is_some_and(|r| r.trim_start().starts_with(':'))
                })
        });
        match hit {
            Some(i) => {
                found = Some(i);
                at = i + 1;
            }
            None => break,
        }
    }
    first_line + found.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_keys_and_errors() {
        let text = "a: 1\nagent:\n  user: x\n  timeout_sec: bad\nsandbox: {cpus: 1}\n";
        assert_eq!(line_of(text, 2, "agent.timeout_sec"), 5);
        assert_eq!(
            line_of(text, 2, "sandbox.cpus"),
            6,
            "flow style: the parent"
        );
        assert_eq!(line_of(text, 2, "nothing"), 2);
        let (line, msg) = parse("a: 1\nb: [\n", 2).expect_err("bad");
        assert!(line >= 3, "{line} {msg}");
        assert!(!msg.contains('\n') && !msg.contains(" at line "), "{msg}");
    }

    #[test]
    fn conversion() {
        let v = parse("a: 1\nb: ~\nc: [1.5, x]\n7: true\n", 1).expect("yaml");
        let t = to_toml(&v, "").expect("toml").expect("some");
        let want: toml::Table =
            toml::from_str("a = 1\nc = [1.5, \"x\"]\n7 = true\n").expect("toml");
        assert_eq!(t, toml::Value::Table(want));
        let v = parse("a: [1, ~]\n", 1).expect("yaml");
        assert!(to_toml(&v, "").expect_err("null").contains("a[1]"));
    }
}
