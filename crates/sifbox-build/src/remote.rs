//! `ADD https://...`: a remote file downloaded for a build step, as Docker
//! does it: named after the URL's last path segment, mode 0600 unless
//! `--chmod`, mtime from `Last-Modified`, never unpacked, and checked
//! against `--checksum=sha256:...` when given.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use crate::error::{BuildError, Result};

/// A downloaded file.
#[derive(Debug)]
pub struct Fetched {
    pub path: PathBuf,
    /// The name Docker gives it (the URL's last path segment).
    pub name: String,
    /// From `Last-Modified`, else 0.
    pub mtime: u64,
    /// `sha256:HEX` of the bytes.
    pub digest: String,
}

/// The file name of a URL: its last non-empty path segment.
pub fn url_file_name(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let path = rest.split(['?', '#']).next().unwrap_or_default();
    let (_, path) = path.split_once('/')?;
    path.rsplit('/').find(|s| !s.is_empty()).map(str::to_string)
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Downloads `url` into `dir`; checks `checksum` (`sha256:HEX`) when given.
pub fn fetch(url: &str, dir: &Path, checksum: Option<&str>) -> Result<Fetched> {
    let bad = |why: String| {
        BuildError::bad(
            format!("ADD {url}"),
            why,
            "check the URL, or download the file in a RUN step",
        )
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(format!("{} URLs are not supported", parsed.scheme())));
    }
    let name = url_file_name(url).ok_or_else(|| bad("the URL names no file".into()))?;
    let mut builder = reqwest::blocking::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(3600))
        .user_agent(concat!("sifbox/", env!("CARGO_PKG_VERSION")));
    if is_loopback(&parsed) {
        builder = builder.no_proxy();
    }
    let client = builder.build().map_err(|e| bad(e.to_string()))?;
    let mut resp = client.get(parsed).send().map_err(|e| bad(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(bad(format!("the server answered {}", resp.status())));
    }
    let mtime = resp
        .headers()
        .get(reqwest::header::LAST_MODIFIED)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let path = dir.join(&name);
    let mut out = std::fs::File::create(&path).map_err(|e| BuildError::io(&path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = resp.read(&mut buf).map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| BuildError::io(&path, e))?;
    }
    let digest = format!("sha256:{}", hex::encode(h.finalize()));
    if let Some(want) = checksum {
        if !want.eq_ignore_ascii_case(&digest) {
            return Err(bad(format!(
                "its content has digest {digest}, not the --checksum {want}"
            )));
        }
    }
    Ok(Fetched {
        path,
        name,
        mtime,
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_last_segment() {
        assert_eq!(
            url_file_name("https://h/a/b.tar.gz").as_deref(),
            Some("b.tar.gz")
        );
        assert_eq!(url_file_name("http://h:8080/x/?q=1").as_deref(), Some("x"));
        assert_eq!(url_file_name("https://h/"), None);
        assert_eq!(url_file_name("https://h"), None);
    }
}
