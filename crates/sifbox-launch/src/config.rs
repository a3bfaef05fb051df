//! The caller's config file, `$XDG_CONFIG_HOME/sifbox/config.toml`
//! (default `~/.config`): read in this one place, for every section.
//!
//! As the XDG Base Directory spec says, an empty `XDG_CONFIG_HOME` counts
//! as unset. A missing file, or one that is not TOML, is an empty config;
//! a value of the wrong kind is an error that names the key and the file.
//!
//! The sections: `[store] shared` ([`UserConfig::store_access`]),
//! `[limits]` ([`UserConfig::limits`]), `[build] host_ca`
//! ([`UserConfig::build_host_ca`]) and `[eval] image_dirs`
//! ([`UserConfig::eval_image_dirs`]).

use std::ffi::OsString;
use std::path::PathBuf;

use sifbox_engine::spec;
use sifbox_image::store::Access;

use crate::error::LaunchError;
use crate::host_ca::DEFAULT_CA;

/// The directory of the config file: `$XDG_CONFIG_HOME/sifbox`, else
/// `$HOME/.config/sifbox` (an empty value counts as unset).
pub fn config_dir_from(xdg: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let base = xdg
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            home.filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("sifbox"))
}

/// The caller's config: its file and table (empty when there is none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UserConfig {
    pub file: PathBuf,
    pub table: toml::Table,
}

/// `[limits]` of the config file: `memory` (a size or "unlimited"),
/// `user_pids` (a number), `nofile` ("SOFT[:HARD]").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsConfig {
    pub memory: Option<crate::Memory>,
    pub user_pids: Option<u64>,
    pub nofile: Option<spec::Nofile>,
}

impl UserConfig {
    /// Reads the caller's config file (see the module's note).
    pub fn load() -> UserConfig {
        let Some(dir) = config_dir_from(
            std::env::var_os("XDG_CONFIG_HOME"),
            std::env::var_os("HOME"),
        ) else {
            return UserConfig::default();
        };
        let file = dir.join("config.toml");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        UserConfig::parse(file, &text)
    }

    /// The config in `text`, read from `file`; text that is not TOML is
    /// an empty config.
    pub fn parse(file: PathBuf, text: &str) -> UserConfig {
        UserConfig {
            table: text.parse::<toml::Table>().unwrap_or_default(),
            file,
        }
    }

    fn get(&self, section: &str, key: &str) -> Option<&toml::Value> {
        self.table.get(section).and_then(|s| s.get(key))
    }

    fn bad(&self, key: &str, value: &dyn std::fmt::Display, why: &str, fix: &str) -> LaunchError {
        LaunchError::Config {
            file: self.file.clone(),
            key: key.into(),
            value: value.to_string(),
            why: why.into(),
            fix: fix.into(),
        }
    }

    /// `[store] shared = BOOL`: whether the store is a lab group's shared
    /// one (default private). `SIFBOX_STORE_SHARED` beats it
    /// ([`crate::store::access`]).
    pub fn store_access(&self) -> Result<Access, LaunchError> {
        match self.get("store", "shared") {
            None | Some(toml::Value::Boolean(false)) => Ok(Access::Private),
            Some(toml::Value::Boolean(true)) => Ok(Access::Group),
            Some(v) => Err(self.bad(
                "store.shared",
                v,
                "not a boolean",
                "say true or false (1 or 0)",
            )),
        }
    }

    /// `[build] host_ca`: true ([`DEFAULT_CA`]) or a path; for builds only.
    pub fn build_host_ca(&self) -> Option<PathBuf> {
        match self.get("build", "host_ca")? {
            toml::Value::Boolean(true) => Some(PathBuf::from(DEFAULT_CA)),
            toml::Value::String(p) => Some(PathBuf::from(p)),
            _ => None,
        }
    }

    /// `[eval] image_dirs = ["DIR", ...]`: dirs whose SIF files tasks may
    /// name, as `eval --allow-image-dir` gives them.
    pub fn eval_image_dirs(&self) -> Result<Vec<PathBuf>, LaunchError> {
        let Some(v) = self.get("eval", "image_dirs") else {
            return Ok(Vec::new());
        };
        let bad = || {
            self.bad(
                "eval.image_dirs",
                v,
                "not a list of directory paths",
                "write image_dirs = [\"/path/to/sifs\"]",
            )
        };
        let toml::Value::Array(items) = v else {
            return Err(bad());
        };
        items
            .iter()
            .map(|i| i.as_str().map(PathBuf::from).ok_or_else(bad))
            .collect()
    }

    /// `[limits]`.
    pub fn limits(&self) -> Result<LimitsConfig, LaunchError> {
        let mut c = LimitsConfig::default();
        let Some(limits) = self.table.get("limits") else {
            return Ok(c);
        };
        let Some(limits) = limits.as_table() else {
            return Err(self.bad(
                "limits",
                limits,
                "[limits] is not a table",
                "write it as a [limits] section",
            ));
        };
        for (key, v) in limits {
            let name = format!("limits.{key}");
            match (key.as_str(), v) {
                ("memory", toml::Value::String(t)) => {
                    c.memory = Some(crate::Memory::parse(t).map_err(|why| {
                        self.bad(
                            &name,
                            v,
                            &why,
                            "give a size such as \"8g\", or \"unlimited\"",
                        )
                    })?);
                }
                ("user_pids", toml::Value::Integer(n)) if *n > 0 => {
                    c.user_pids = u64::try_from(*n).ok();
                }
                ("nofile", toml::Value::String(t)) => {
                    c.nofile = Some(spec::parse_ulimit(&format!("nofile={t}")).map_err(|why| {
                        self.bad(&name, v, &why, "give \"SOFT:HARD\" such as \"1024:524288\"")
                    })?);
                }
                ("memory" | "user_pids" | "nofile", _) => return Err(self.bad(
                    &name,
                    v,
                    "not a value of the right kind",
                    "memory = \"8g\" or \"unlimited\"; user_pids = 16384; nofile = \"1024:524288\"",
                )),
                _ => {
                    return Err(self.bad(
                        &name,
                        v,
                        "no such limit",
                        "[limits] takes memory, user_pids and nofile",
                    ))
                }
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> UserConfig {
        UserConfig::parse(PathBuf::from("/c.toml"), text)
    }

    #[test]
    fn an_empty_xdg_config_home_counts_as_unset() {
        let home = Some(OsString::from("/home/u"));
        assert_eq!(
            config_dir_from(Some(OsString::new()), home.clone()),
            Some(PathBuf::from("/home/u/.config/sifbox"))
        );
        assert_eq!(
            config_dir_from(Some(OsString::from("/x")), home),
            Some(PathBuf::from("/x/sifbox"))
        );
        assert_eq!(config_dir_from(None, None), None);
        assert_eq!(
            config_dir_from(Some(OsString::new()), Some(OsString::new())),
            None
        );
    }

    #[test]
    fn a_file_that_is_not_toml_is_an_empty_config() {
        let c = config("this is [not toml");
        assert!(c.table.is_empty());
        assert_eq!(c.store_access().ok(), Some(Access::Private));
        assert_eq!(c.limits().ok(), Some(LimitsConfig::default()));
    }

    #[test]
    fn each_section_reads_its_keys() {
        let c = config(
            "[store]\nshared = true\n[build]\nhost_ca = true\n[eval]\nimage_dirs = [\"/sifs\"]\n[limits]\nmemory = \"unlimited\"\nuser_pids = 50\nnofile = \"10:20\"",
        );
        assert_eq!(c.store_access().ok(), Some(Access::Group));
        assert_eq!(c.build_host_ca(), Some(PathBuf::from(DEFAULT_CA)));
        assert_eq!(c.eval_image_dirs().ok(), Some(vec![PathBuf::from("/sifs")]));
        let l = c.limits().expect("limits");
        assert_eq!(l.memory, Some(crate::Memory::Unlimited));
        assert_eq!(l.user_pids, Some(50));
        assert_eq!(l.nofile, Some(spec::Nofile { soft: 10, hard: 20 }));
        assert_eq!(
            config("[build]\nhost_ca = \"/my/ca.pem\"").build_host_ca(),
            Some(PathBuf::from("/my/ca.pem"))
        );
    }

    #[test]
    fn a_bad_value_names_the_key_and_the_file() {
        for bad in [
            "[limits]\nmemory = 5",
            "[limits]\nmemory = \"lots\"",
            "[limits]\nuser_pids = -1",
            "[limits]\nnofile = \"9:1\"",
            "[limits]\nswap = 1",
            "limits = 3",
        ] {
            let e = config(bad).limits().expect_err(bad).to_string();
            assert!(e.contains("/c.toml") && e.contains("limits"), "{bad}: {e}");
        }
        let e = config("[store]\nshared = 1")
            .store_access()
            .expect_err("int");
        assert!(
            e.to_string()
                .starts_with("store.shared = 1 in /c.toml: not a boolean"),
            "{e}"
        );
        let e = config("[eval]\nimage_dirs = \"/x\"")
            .eval_image_dirs()
            .expect_err("str");
        assert!(e.to_string().contains("eval.image_dirs"), "{e}");
    }
}
