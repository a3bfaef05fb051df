//! What a build takes from its user beyond the Dockerfile: build args,
//! secrets and the host's CA bundle (flags, the environment and sifbox's
//! config file), for the CLI and library users alike.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::BuildError;

/// The host's CA bundle on Debian and its relatives.
pub const DEFAULT_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

/// `--build-arg KEY=VALUE` (or `KEY` alone: its value from the environment,
/// left out when the environment has none, as Docker does).
pub fn build_args(args: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for a in args {
        match a.split_once('=') {
            Some((k, v)) => {
                out.insert(k.to_string(), v.to_string());
            }
            None => {
                // As Docker: KEY alone takes the value from the environment,
                // and is left out when the environment has none.
                if let Ok(v) = std::env::var(a) {
                    out.insert(a.clone(), v);
                }
            }
        }
    }
    out
}

/// `--secret id=ID,src=PATH` (or `env=VAR`, whose value goes to a 0600
/// file in `scratch`): the secrets `RUN --mount=type=secret` may mount.
pub fn secrets(args: &[String], scratch: &Path) -> Result<BTreeMap<String, PathBuf>, BuildError> {
    let mut out = BTreeMap::new();
    for (i, a) in args.iter().enumerate() {
        let mut id = None;
        let mut src = None;
        let mut env = None;
        for field in a.split(',') {
            match field.split_once('=') {
                Some(("id", v)) => id = Some(v.to_string()),
                Some(("src" | "source", v)) => src = Some(PathBuf::from(v)),
                Some(("env", v)) => env = Some(v.to_string()),
                Some(("type", "file" | "env")) => {}
                _ => {
                    return Err(BuildError::bad(
                        format!("--secret {a}"),
                        format!("unknown field {field:?}"),
                        "use --secret id=ID,src=PATH or --secret id=ID,env=VAR",
                    ))
                }
            }
        }
        let id = id.or_else(|| env.clone()).ok_or_else(|| {
            BuildError::bad(
                format!("--secret {a}"),
                "no id",
                "use --secret id=ID,src=PATH",
            )
        })?;
        let path = match (src, env) {
            (Some(p), _) => {
                if !p.is_file() {
                    return Err(BuildError::bad(
                        format!("--secret {a}"),
                        format!("{} is not a file", p.display()),
                        "pass an existing file as src=",
                    ));
                }
                std::fs::canonicalize(&p).map_err(|e| {
                    BuildError::bad(
                        format!("--secret {a}"),
                        e.to_string(),
                        "pass a readable file",
                    )
                })?
            }
            (None, Some(var)) => {
                let v = std::env::var(&var).map_err(|_| {
                    BuildError::bad(
                        format!("--secret {a}"),
                        format!("${var} is not set"),
                        "export it or use src=PATH",
                    )
                })?;
                let p = scratch.join(format!("secret-{i}"));
                write_private(&p, v.as_bytes()).map_err(|e| BuildError::io(&p, e))?;
                p
            }
            (None, None) => {
                return Err(BuildError::bad(
                    format!("--secret {a}"),
                    "no src= or env=",
                    "use --secret id=ID,src=PATH",
                ))
            }
        };
        out.insert(id, path);
    }
    Ok(out)
}

fn write_private(p: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)?;
    f.write_all(data)
}

/// Where `--host-ca` shows the host's CA bundle, in build steps and in
/// sandboxes.
pub const HOST_CA_PATH: &str = "/run/sifbox/host-ca.crt";
/// Environment variables that point common tools at the host CA bundle.
pub const CA_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

/// The host's CA bundle `ca` shown in a sandbox: a read-only bind at
/// [`HOST_CA_PATH`], and [`CA_ENV`] pointing there, added to `env` where it
/// does not set them already. Errs (bad input) when `ca` is not a file.
pub fn show_host_ca(
    ca: &Path,
    binds: &mut Vec<sifbox_engine::spec::Bind>,
    env: &mut Vec<(String, String)>,
) -> Result<(), BuildError> {
    if !ca.is_file() {
        return Err(BuildError::bad(
            format!("--host-ca {}", ca.display()),
            "no such file",
            "pass the host's CA bundle file (--host-ca=FILE), or --host-ca alone for /etc/ssl/certs/ca-certificates.crt",
        ));
    }
    binds.push(sifbox_engine::spec::Bind {
        src: ca.to_path_buf(),
        dst: PathBuf::from(HOST_CA_PATH),
        readonly: true,
    });
    for k in CA_ENV {
        if !env.iter().any(|(e, _)| e == k) {
            env.push(((*k).into(), HOST_CA_PATH.into()));
        }
    }
    Ok(())
}

/// `SIFBOX_HOST_CA` alone (1/true/yes: [`DEFAULT_CA`], 0/false/no: none,
/// else a path): what sandboxes (`run`, `start`, eval's rollouts) show
/// without `--host-ca`. (`[build] host_ca` in the config file is for
/// builds only.)
pub fn host_ca_from_env() -> Option<PathBuf> {
    let v = std::env::var("SIFBOX_HOST_CA").ok()?;
    match v.as_str() {
        "" | "0" | "false" | "no" => None,
        "1" | "true" | "yes" => Some(PathBuf::from(DEFAULT_CA)),
        path => Some(PathBuf::from(path)),
    }
}

/// Whether the config file or the environment asks for the host CA:
/// `SIFBOX_HOST_CA` (1/true/yes: [`DEFAULT_CA`], 0/false/no: none, else a
/// path), else `[build] host_ca` (true or a path) in
/// `$XDG_CONFIG_HOME/sifbox/config.toml` (default ~/.config).
pub fn host_ca_from_config() -> Option<PathBuf> {
    if let Ok(v) = std::env::var("SIFBOX_HOST_CA") {
        return match v.as_str() {
            "" | "0" | "false" | "no" => None,
            "1" | "true" | "yes" => Some(PathBuf::from(DEFAULT_CA)),
            path => Some(PathBuf::from(path)),
        };
    }
    let dir = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let text = std::fs::read_to_string(dir.join("sifbox/config.toml")).ok()?;
    let v: toml::Table = text.parse().ok()?;
    match v.get("build")?.get("host_ca")? {
        toml::Value::Boolean(true) => Some(PathBuf::from(DEFAULT_CA)),
        toml::Value::String(p) => Some(PathBuf::from(p)),
        _ => None,
    }
}
