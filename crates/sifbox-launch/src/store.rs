//! The image store at its default place, opened as the caller's config
//! says: private, or a lab group's shared store.

use sifbox_image::store::{Access, Store};

use crate::config::UserConfig;
use crate::error::LaunchError;

/// Whether the store is a lab group's shared one: `SIFBOX_STORE_SHARED`
/// (1/true/yes or 0/false/no), else `[store] shared = BOOL` of the config
/// file, else private.
pub fn access(config: &UserConfig) -> Result<Access, LaunchError> {
    match std::env::var("SIFBOX_STORE_SHARED") {
        Ok(v) => access_from_env(&v),
        Err(_) => config.store_access(),
    }
}

fn access_from_env(v: &str) -> Result<Access, LaunchError> {
    match v {
        "" | "0" | "false" | "no" => Ok(Access::Private),
        "1" | "true" | "yes" => Ok(Access::Group),
        _ => Err(LaunchError::Env {
            var: "SIFBOX_STORE_SHARED",
            value: v.to_string(),
            why: "not a yes or no",
            fix: "say true or false (1 or 0)",
        }),
    }
}

/// Opens the store at its default place ([`access`]).
pub fn open() -> Result<Store, LaunchError> {
    let access = access(&UserConfig::load())?;
    Ok(Store::open_with(&Store::default_root(), access)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_says_yes_or_no() {
        assert_eq!(access_from_env("").ok(), Some(Access::Private));
        assert_eq!(access_from_env("yes").ok(), Some(Access::Group));
        let e = access_from_env("maybe").expect_err("not a yes or no");
        assert_eq!(
            e.to_string(),
            "SIFBOX_STORE_SHARED=maybe: not a yes or no; say true or false (1 or 0)"
        );
    }
}
