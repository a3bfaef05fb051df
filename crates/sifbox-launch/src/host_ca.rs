//! The host's CA bundle shown inside a sandbox or a build step, for sites
//! whose HTTPS goes through an intercepting proxy: a read-only bind at
//! [`HOST_CA_PATH`] and the variables of [`CA_ENV`] pointing there. Which
//! bundle: `--host-ca[=FILE]`, else `SIFBOX_HOST_CA`, else (builds only)
//! `[build] host_ca` of the config file.

use std::path::{Path, PathBuf};

use sifbox_engine::spec::Bind;

use crate::error::LaunchError;

/// The host's CA bundle on Debian and its relatives.
pub const DEFAULT_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where the host's CA bundle is shown, in build steps and in sandboxes.
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

/// `SIFBOX_HOST_CA`'s meaning: 1/true/yes [`DEFAULT_CA`], 0/false/no (or
/// empty) none, else a path.
pub fn parse_env(v: &str) -> Option<PathBuf> {
    match v {
        "" | "0" | "false" | "no" => None,
        "1" | "true" | "yes" => Some(PathBuf::from(DEFAULT_CA)),
        path => Some(PathBuf::from(path)),
    }
}

/// The bundle sandboxes (`run`, `start`, eval's rollouts) show: `flag`
/// (`--host-ca`), else `SIFBOX_HOST_CA`. Errs when it is not a file.
pub fn for_sandboxes(flag: Option<&Path>) -> Result<Option<PathBuf>, LaunchError> {
    checked(flag.map(Path::to_path_buf).or_else(from_env))
}

/// The bundle build steps see: `flag`, else `SIFBOX_HOST_CA`, else
/// `configured` (`UserConfig::build_host_ca`); not yet [`checked`].
pub fn for_builds(flag: Option<&Path>, configured: Option<PathBuf>) -> Option<PathBuf> {
    match (flag, std::env::var("SIFBOX_HOST_CA")) {
        (Some(f), _) => Some(f.to_path_buf()),
        (None, Ok(v)) => parse_env(&v),
        (None, Err(_)) => configured,
    }
}

fn from_env() -> Option<PathBuf> {
    parse_env(&std::env::var("SIFBOX_HOST_CA").ok()?)
}

/// The one check of a bundle: it is a file.
pub fn checked(ca: Option<PathBuf>) -> Result<Option<PathBuf>, LaunchError> {
    match ca {
        Some(path) if !path.is_file() => Err(LaunchError::HostCaMissing { path }),
        ca => Ok(ca),
    }
}

/// The bundle `ca` shown in a sandbox: a read-only bind at
/// [`HOST_CA_PATH`], and [`CA_ENV`] pointing there, added to `env` where
/// it does not set them already.
pub fn show(ca: &Path, binds: &mut Vec<Bind>, env: &mut Vec<(String, String)>) {
    binds.push(Bind {
        src: ca.to_path_buf(),
        dst: PathBuf::from(HOST_CA_PATH),
        readonly: true,
    });
    for k in CA_ENV {
        if !env.iter().any(|(e, _)| e == k) {
            env.push(((*k).into(), HOST_CA_PATH.into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_says_yes_no_or_a_path() {
        assert_eq!(parse_env(""), None);
        assert_eq!(parse_env("no"), None);
        assert_eq!(parse_env("1"), Some(PathBuf::from(DEFAULT_CA)));
        assert_eq!(parse_env("/a/b.pem"), Some(PathBuf::from("/a/b.pem")));
    }

    #[test]
    fn a_missing_bundle_is_refused_by_name() {
        let e = checked(Some("/nonexistent/ca.crt".into())).expect_err("missing");
        assert!(
            e.to_string()
                .starts_with("--host-ca /nonexistent/ca.crt: no such file"),
            "{e}"
        );
        assert!(checked(None).expect("none").is_none());
    }

    #[test]
    fn the_bundle_is_bound_read_only_and_its_variables_set_where_unset() {
        let mut binds = Vec::new();
        let mut env = vec![("SSL_CERT_FILE".to_string(), "/mine.pem".to_string())];
        show(Path::new("/host/ca.crt"), &mut binds, &mut env);
        assert_eq!(binds.len(), 1);
        assert!(binds[0].readonly && binds[0].dst == Path::new(HOST_CA_PATH));
        assert_eq!(env[0].1, "/mine.pem");
        assert_eq!(env.len(), CA_ENV.len());
        assert!(env[1..].iter().all(|(_, v)| v == HOST_CA_PATH));
    }
}
