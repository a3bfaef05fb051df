//! Where registry credentials come from, first match wins:
//!
//! 1. `--creds USER:PASS` (given by the caller);
//! 2. `$REGISTRY_AUTH_FILE` (the containers-auth.json format of podman,
//!    skopeo and buildah: an `auths` map like Docker's);
//! 3. `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`: a
//!    credential helper for the registry (`credHelpers`), an `auths` entry
//!    (`auth` = base64 `user:pass`, or `username` and `password`), then the
//!    default helper (`credsStore`).
//!
//! A helper is `docker-credential-NAME get`, given the server on stdin and
//! printing `{"Username":…,"Secret":…}`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use serde::Deserialize;

use crate::reference::DOCKER_HUB;

/// A user name and password (or token) for a registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Credentials {
    /// Parses `USER:PASS` (the password may contain ':').
    ///
    /// # Errors
    ///
    /// When there is no ':' or the user name is empty.
    pub fn parse(s: &str) -> Result<Credentials, String> {
        match s.split_once(':') {
            Some((u, p)) if !u.is_empty() => Ok(Credentials {
                username: u.to_string(),
                password: p.to_string(),
            }),
            _ => Err("expected USER:PASSWORD".into()),
        }
    }
}

/// Credentials found for a registry, and where they came from.
#[derive(Debug, Clone)]
pub struct Found {
    pub credentials: Credentials,
    pub source: String,
}

#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(rename = "credHelpers", default)]
    cred_helpers: BTreeMap<String, String>,
    #[serde(rename = "credsStore", default)]
    creds_store: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(rename = "identitytoken", default)]
    identity_token: Option<String>,
}

#[derive(Debug, Deserialize)]
struct HelperReply {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// The names a registry may be filed under in an `auths` map.
fn keys_for(registry: &str) -> Vec<String> {
    if registry == DOCKER_HUB {
        vec![
            "https://index.docker.io/v1/".into(),
            "index.docker.io".into(),
            "docker.io".into(),
            "registry-1.docker.io".into(),
        ]
    } else {
        vec![registry.to_string()]
    }
}

/// `https://host:port/v1/` -> `host:port`.
fn normalize_key(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// The server name a helper is asked about.
fn helper_server(registry: &str) -> String {
    if registry == DOCKER_HUB {
        "https://index.docker.io/v1/".into()
    } else {
        registry.to_string()
    }
}

/// Looks up credentials for `registry` (as named in references:
/// `docker.io`, `host:port`).
///
/// # Errors
///
/// A message naming the file or helper that failed (a malformed file, a
/// helper that cannot run or prints nonsense).
pub fn lookup(registry: &str) -> Result<Option<Found>, String> {
    if let Some(f) = std::env::var_os("REGISTRY_AUTH_FILE").filter(|f| !f.is_empty()) {
        let path = PathBuf::from(f);
        if let Some(found) = from_file(&path, registry)? {
            return Ok(Some(found));
        }
    }
    let docker = match std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        Some(d) => Some(PathBuf::from(d).join("config.json")),
        None => std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".docker").join("config.json")),
    };
    match docker {
        Some(p) => from_file(&p, registry),
        None => Ok(None),
    }
}

/// Credentials for `registry` from one config file (a missing file has
/// none).
///
/// # Errors
///
/// As [`lookup`].
pub fn from_file(path: &Path, registry: &str) -> Result<Option<Found>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let cfg: ConfigFile = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a registry auth file: {e}", path.display()))?;
    let keys = keys_for(registry);
    if let Some(helper) = cfg
        .cred_helpers
        .iter()
        .find(|(k, _)| {
            keys.iter()
                .any(|want| normalize_key(k) == normalize_key(want))
        })
        .map(|(_, h)| h)
    {
        return run_helper(helper, registry);
    }
    for (k, entry) in &cfg.auths {
        if !keys
            .iter()
            .any(|want| normalize_key(k) == normalize_key(want))
        {
            continue;
        }
        let source = format!("{} (auths.{k})", path.display());
        if let Some(c) = entry_credentials(entry).map_err(|e| format!("{source}: {e}"))? {
            return Ok(Some(Found {
                credentials: c,
                source,
            }));
        }
    }
    match &cfg.creds_store {
        Some(h) if !h.is_empty() => run_helper(h, registry),
        _ => Ok(None),
    }
}

fn entry_credentials(e: &AuthEntry) -> Result<Option<Credentials>, String> {
    if let Some(a) = e.auth.as_deref().filter(|a| !a.is_empty()) {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(a.trim())
            .map_err(|_| "`auth` is not base64".to_string())?;
        let text = String::from_utf8(raw).map_err(|_| "`auth` is not UTF-8".to_string())?;
        return Credentials::parse(&text)
            .map(Some)
            .map_err(|_| "`auth` is not base64 of USER:PASSWORD".to_string());
    }
    match (&e.username, &e.password, &e.identity_token) {
        (Some(u), Some(p), _) if !u.is_empty() => Ok(Some(Credentials {
            username: u.clone(),
            password: p.clone(),
        })),
        (_, _, Some(t)) if !t.is_empty() => Ok(Some(Credentials {
            username: "<token>".into(),
            password: t.clone(),
        })),
        _ => Ok(None),
    }
}

fn run_helper(name: &str, registry: &str) -> Result<Option<Found>, String> {
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!("credential helper name {name:?} is not valid"));
    }
    let program = format!("docker-credential-{name}");
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("credential helper {program}: cannot run it: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(helper_server(registry).as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("credential helper {program}: {e}"))?;
    let source = format!("credential helper {program}");
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        if msg.to_ascii_lowercase().contains("not found") {
            return Ok(None);
        }
        return Err(format!("{source} failed: {}", msg.trim()));
    }
    let reply: HelperReply = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{source}: unexpected output: {e}"))?;
    if reply.username.is_empty() && reply.secret.is_empty() {
        return Ok(None);
    }
    Ok(Some(Found {
        credentials: Credentials {
            username: reply.username,
            password: reply.secret,
        },
        source,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3:cret");
        std::fs::write(
            &p,
            format!(
                r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},
                    "http://127.0.0.1:5000":{{"username":"bob","password":"pw"}},
                    "empty.example":{{}}}}}}"#
            ),
        )
        .expect("write");
        let hub = from_file(&p, DOCKER_HUB).expect("ok").expect("found");
        assert_eq!(hub.credentials.username, "alice");
        assert_eq!(hub.credentials.password, "s3:cret");
        let local = from_file(&p, "127.0.0.1:5000").expect("ok").expect("found");
        assert_eq!(local.credentials.username, "bob");
        assert!(from_file(&p, "empty.example").expect("ok").is_none());
        assert!(from_file(&p, "other.example").expect("ok").is_none());
        assert!(from_file(&dir.path().join("missing"), "x")
            .expect("ok")
            .is_none());
        std::fs::write(&p, b"{not json").expect("write");
        assert!(from_file(&p, "x").is_err());
        std::fs::write(&p, br#"{"auths":{"x.example":{"auth":"!!"}}}"#).expect("write");
        assert!(from_file(&p, "x.example").is_err());
        std::fs::write(&p, br#"{"credHelpers":{"x.example":"../evil"}}"#).expect("write");
        assert!(from_file(&p, "x.example").is_err());
    }

    #[test]
    fn creds_flag() {
        let c = Credentials::parse("u:p:q").expect("ok");
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "p:q"));
        assert!(Credentials::parse("nocolon").is_err());
        assert!(Credentials::parse(":p").is_err());
        assert!(!format!("{c:?}").contains("p:q"));
    }
}
