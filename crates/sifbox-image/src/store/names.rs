//! Image names (`NAME[:TAG]`) and keys as file names.

use super::{Result, StoreError};

/// NAME[:TAG] with the tag made explicit (`latest` by default).
pub fn normalize_name(name: &str) -> Result<String> {
    let (repo, tag) = match name.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, t),
        _ => (name, "latest"),
    };
    let ok_repo = !repo.is_empty()
        && repo.len() <= 255
        && repo
            .bytes()
            // ':' only as a registry's port (`host:5000/repo`).
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b':'))
        && repo.split('/').skip(1).all(|part| !part.contains(':'))
        && !repo.starts_with(['.', '-', '/', ':'])
        && !repo.contains("..");
    let ok_tag = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok_repo && ok_tag && !name.starts_with("sha256:") {
        Ok(format!("{repo}:{tag}"))
    } else {
        Err(StoreError::BadName(name.to_string()))
    }
}

/// A key as one file name: `/` and `%` escaped.
pub(super) fn escape(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

pub(super) fn unescape(name: &str) -> String {
    name.replace("%2F", "/").replace("%25", "%")
}
