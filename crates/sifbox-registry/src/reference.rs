//! Image references as Docker resolves them.
//!
//! `[docker://][REGISTRY/]REPOSITORY[:TAG][@DIGEST]`: the first component is
//! a registry when it has a `.` or a `:` or is `localhost`; otherwise the
//! registry is Docker Hub (`docker.io`), where a one-component repository
//! gets `library/`. The tag defaults to `latest` unless a digest is given.
//! Repository components are lowercase letters and digits joined by `.`,
//! `_`, `__` or dashes; tags are up to 128 of `[A-Za-z0-9_.-]` not starting
//! with `.` or `-`; the whole name is at most 255 characters.

use std::fmt;

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";
/// Where Docker Hub's registry API is served.
pub const DOCKER_HUB_ENDPOINT: &str = "registry-1.docker.io";

/// A parsed, normalized image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

/// Why a reference does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("image reference {input:?}: {reason}")]
pub struct ReferenceError {
    /// The reference as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl Reference {
    /// Parses a reference (an optional `docker://` prefix is dropped).
    ///
    /// # Errors
    ///
    /// [`ReferenceError`] saying which part is malformed.
    pub fn parse(input: &str) -> Result<Reference, ReferenceError> {
        let err = |reason: String| ReferenceError {
            input: input.to_string(),
            reason,
        };
        let s = input.strip_prefix("docker://").unwrap_or(input);
        if s.is_empty() {
            return Err(err("empty".into()));
        }
        if s.len() > 4096 {
            return Err(err("too long".into()));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(parse_digest(d).map_err(err)?)),
            None => (s, None),
        };
        // A tag is after the last ':' that has no '/' after it (a ':' before
        // a '/' is a registry's port).
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(t) = tag {
            check_tag(t).map_err(err)?;
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path)) if is_registry(first) => {
                check_registry(first).map_err(err)?;
                (first.to_string(), path.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_string(),
            _ => registry,
        };
        check_repository(&repository).map_err(err)?;
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if registry.len() + 1 + repository.len() > 255 {
            return Err(err("the name is longer than 255 characters".into()));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The registry as named in the reference (`docker.io`, `host:port`).
    #[must_use]
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// Host (and port) serving the registry API.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_ENDPOINT
        } else {
            &self.registry
        }
    }

    /// The repository (`library/debian`).
    #[must_use]
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag; `None` for a reference by digest alone.
    #[must_use]
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, `sha256:HEX`, when given.
    #[must_use]
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// What the manifest is fetched by: the digest when given, else the tag.
    #[must_use]
    pub fn manifest_ref(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// The name a pulled image gets in the store, `REGISTRY/REPO:TAG`, when
    /// the reference has a tag.
    #[must_use]
    pub fn store_name(&self) -> Option<String> {
        self.tag
            .as_ref()
            .map(|t| format!("{}/{}:{t}", self.registry, self.repository))
    }

    /// Whether the registry is on this machine (plain HTTP is allowed).
    #[must_use]
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        host == "localhost"
            || host == "[::1]"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|a| a.is_loopback())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

fn is_registry(first: &str) -> bool {
    first.contains('.')
        || first.contains(':')
        || first == "localhost"
        || first.bytes().any(|b| b.is_ascii_uppercase())
}

fn check_registry(r: &str) -> Result<(), String> {
    let bad = || format!("registry {r:?} is not HOST[:PORT]");
    let (host, port) = if let Some(v6) = r.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or_else(bad)?;
        addr.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
        (None, after.strip_prefix(':'))
    } else {
        match r.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(r), None),
        }
    };
    if let Some(host) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.is_empty() || !host.split('.').all(label_ok) {
            return Err(bad());
        }
    }
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
    }
    Ok(())
}

fn check_repository(repo: &str) -> Result<(), String> {
    if repo.is_empty() {
        return Err("no repository name".into());
    }
    for comp in repo.split('/') {
        if comp.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(format!("repository {repo:?} must be lowercase"));
        }
        if !component_ok(comp.as_bytes()) {
            return Err(format!(
                "repository component {comp:?}: use lowercase letters and digits, \
                 joined by '.', '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn component_ok(c: &[u8]) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    let run = |i: &mut usize| {
        let start = *i;
        while *i < c.len() && alnum(c[*i]) {
            *i += 1;
        }
        *i > start
    };
    if !run(&mut i) {
        return false;
    }
    while i < c.len() {
        let sep_start = i;
        match c[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < c.len() && c[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < c.len() && c[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        debug_assert!(i > sep_start);
        if !run(&mut i) {
            return false;
        }
    }
    true
}

fn check_tag(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !t.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag {t:?}: up to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'"
        ))
    }
}

fn parse_digest(d: &str) -> Result<String, String> {
    let (alg, hex) = d
        .split_once(':')
        .ok_or_else(|| format!("digest {d:?} is not ALGORITHM:HEX"))?;
    let hex_ok = |n: usize| {
        hex.len() == n
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match alg {
        "sha256" if hex_ok(64) => Ok(d.to_string()),
        "sha256" => Err(format!(
            "digest {d:?}: sha256 takes 64 lowercase hex digits"
        )),
        _ => Err(format!("digest {d:?}: only sha256 digests are supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(s: &str) -> String {
        Reference::parse(s).expect(s).to_string()
    }

    #[test]
    fn docker_defaults() {
        assert_eq!(full("debian"), "docker.io/library/debian:latest");
        assert_eq!(full("docker://debian:12"), "docker.io/library/debian:12");
        assert_eq!(full("user/app"), "docker.io/user/app:latest");
        assert_eq!(
            full("index.docker.io/debian"),
            "docker.io/library/debian:latest"
        );
        assert_eq!(
            full("docker.io/library/python:3.12-slim"),
            "docker.io/library/python:3.12-slim"
        );
        assert_eq!(full("localhost/x"), "localhost/x:latest");
        assert_eq!(full("localhost:5000/a/b:t"), "localhost:5000/a/b:t");
        assert_eq!(full("127.0.0.1:5000/x"), "127.0.0.1:5000/x:latest");
        assert_eq!(full("ghcr.io/o/r"), "ghcr.io/o/r:latest");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("debian@{d}")).expect("digest");
        assert_eq!(r.tag(), None);
        assert_eq!(r.manifest_ref(), d);
        assert_eq!(r.store_name(), None);
        let r = Reference::parse(&format!("quay.io/a/b:1@{d}")).expect("both");
        assert_eq!(r.tag(), Some("1"));
        assert_eq!(r.manifest_ref(), d, "the digest wins");
        assert_eq!(
            Reference::parse("debian").expect("ok").endpoint(),
            DOCKER_HUB_ENDPOINT
        );
        assert_eq!(
            Reference::parse("debian")
                .expect("ok")
                .store_name()
                .as_deref(),
            Some("docker.io/library/debian:latest")
        );
        assert!(Reference::parse("localhost:1/x").expect("ok").is_loopback());
        assert!(Reference::parse("127.0.0.1:1/x").expect("ok").is_loopback());
        assert!(!Reference::parse("example.com/x").expect("ok").is_loopback());
    }

    #[test]
    fn rejects() {
        for bad in [
            "",
            "Debian",
            "a//b",
            "a/-b",
            "a:",
            "a:-x",
            "a@sha256:abc",
            "a@md5:d41d8cd98f00b204e9800998ecf8427e",
            "host:port/x",
            "a b",
            "a/b/",
            "/a",
            "ex..ample.com/x",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?} should fail");
        }
        assert!(component_ok(b"a__b"));
        assert!(!component_ok(b"a___b"));
        assert!(component_ok(b"a---b"));
        assert!(component_ok(b"a.b_c-d"));
    }
}
