//! The checks of single values that several sections share (time limits,
//! env tables, users, sizes, names).

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::model::RawUser;
use super::super::{bad, MAX_MB, MAX_TIMEOUT_SEC};
use crate::error::Result;
use crate::template;

pub(super) fn timeout(v: Option<f64>, default: f64, key: &str, file: &str) -> Result<Duration> {
    let s = v.unwrap_or(default);
    if !s.is_finite() || s <= 0.0 || s > MAX_TIMEOUT_SEC {
        return Err(bad(
            format!("{file}: {key} = {s}"),
            "not a positive number of seconds (at most a week)",
            format!("set {key} to e.g. {default}"),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

pub(super) fn check_env(
    map: BTreeMap<String, String>,
    key: &str,
    file: &str,
) -> Result<Vec<(String, String)>> {
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        if !template::is_var_name(&k) {
            return Err(bad(
                format!("{file}: {key}.{k:?}"),
                "not a valid environment variable name",
                "use letters, digits and _ (not starting with a digit)",
            ));
        }
        if v.contains('\0') {
            return Err(bad(
                format!("{file}: {key}.{k}"),
                "the value contains a NUL byte",
                "remove it",
            ));
        }
        template::check(&v).map_err(|why| {
            bad(
                format!("{file}: {key}.{k}"),
                why,
                "write ${VAR} or ${VAR:-default} (a literal $ as $$)",
            )
        })?;
        out.push((k, v));
    }
    Ok(out)
}

pub(super) fn check_user(u: Option<RawUser>, key: &str, file: &str) -> Result<Option<String>> {
    let bad_user = |shown: String| {
        bad(
            format!("{file}: {key} = {shown}"),
            "not a user",
            "name a user of the image (NAME, UID or UID:GID; a number is a UID), or leave it out for the image's user",
        )
    };
    match u {
        None => Ok(None),
        Some(RawUser::Id(n)) => u32::try_from(n)
            .map(|n| Some(n.to_string()))
            .map_err(|_| bad_user(n.to_string())),
        Some(RawUser::Name(u))
            if u.is_empty() || u.len() > 256 || u.chars().any(char::is_control) =>
        {
            Err(bad_user(format!("{u:?}")))
        }
        Some(RawUser::Name(u)) => Ok(Some(u)),
    }
}

/// Parses `2G`, `512M`, `1024K`, `1T` (powers of 1024) or a bare number
/// of bytes into MiB.
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult): (&str, u64) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    let n: f64 = num.trim().parse().ok()?;
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a finite, non-negative size in MiB, clamped below"
    )]
    let mib = (n * mult as f64 / f64::from(1u32 << 20)).min(1e15).ceil() as u64;
    Some(mib)
}

/// `KEY_mb`, or the legacy `KEY = "2G"` (both: they must agree, as Harbor
/// requires), in MiB.
pub(super) fn size_mb(
    mb: Option<u64>,
    legacy: Option<&str>,
    key: &str,
    file: &str,
) -> Result<Option<u64>> {
    let from_legacy = match legacy {
        None => None,
        Some(s) => Some(parse_memory(s).ok_or_else(|| {
            bad(
                format!("{file}: [environment] {key} = {s:?}"),
                "not a size",
                format!("write e.g. {key}_mb = 2048 (or {key} = \"2G\")"),
            )
        })?),
    };
    match (mb, from_legacy) {
        (Some(m), Some(l)) if m != l => Err(bad(
            format!(
                "{file}: [environment] {key}_mb = {m} and {key} = {:?}",
                legacy.unwrap_or("")
            ),
            format!("they disagree ({l} MiB against {m})"),
            format!("keep {key}_mb alone ({key} is its old spelling)"),
        )),
        (Some(m), _) => check_mb(Some(m), key, file),
        (None, l) => check_mb(l, key, file),
    }
}

pub(super) fn check_mb(mb: Option<u64>, key: &str, file: &str) -> Result<Option<u64>> {
    match mb {
        Some(m) if m > MAX_MB => Err(bad(
            format!("{file}: [environment] {key}_mb = {m}"),
            "too large (at most 2^30 MiB)",
            format!("set {key}_mb to what the task needs, in MiB"),
        )),
        other => Ok(other),
    }
}

/// Whether `name` is a step name Harbor takes (`validate_step_name`): one
/// portable directory name.
pub fn valid_step_name(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or("").trim_end_matches(' ');
    let upper = stem.to_ascii_uppercase();
    let device = matches!(
        upper.as_str(),
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$"
    ) || ((upper.starts_with("COM") || upper.starts_with("LPT"))
        && upper.len() == 4
        && upper.as_bytes()[3].is_ascii_digit()
        && upper.as_bytes()[3] != b'0');
    !name.trim().is_empty()
        && name != "."
        && name != ".."
        && !name.ends_with(['.', ' '])
        && !name
            .chars()
            .any(|c| c.is_control() || "<>:\"/\\|?*".contains(c))
        && !device
        && name.len() <= 255
}

/// Whether `name` is usable as a task name (a path component of results,
/// part of a sandbox name).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
