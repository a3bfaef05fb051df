//! What a build takes from its user beyond the Dockerfile: build args and
//! secrets, for the CLI and library users alike. (The host's CA bundle is
//! `sifbox_launch::host_ca`'s.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::BuildError;

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
