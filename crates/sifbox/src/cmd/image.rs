//! `sifbox image ...`: the image store, and how IMAGE arguments resolve.

use std::path::PathBuf;
use std::process::ExitCode;

use sifbox_engine::Error;
use sifbox_image::import;
use sifbox_image::store::{Access, Digest, Removed, Store, StoreError};

#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// List the images in the store.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show an image: digest, names, size, metadata.
    Inspect {
        reference: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove names (and the image once no name is left, or when given by
    /// digest). An image a running sandbox, build or eval uses is refused,
    /// unless --force.
    Rm {
        /// Remove the names of an image in use now, and the image itself
        /// once nothing uses it (`sifbox gc` then reclaims it).
        #[arg(long, short = 'f')]
        force: bool,
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Give an image another NAME[:TAG].
    Tag { reference: String, name: String },
    /// Import a .sif, a rootfs directory or tarball, an OCI layout or
    /// archive, or a docker-archive; prints the digest.
    Import {
        source: PathBuf,
        #[arg(long, value_name = "NAME[:TAG]")]
        name: Option<String>,
    },
    /// Write an image as a SIF file that Apptainer runs.
    Export { reference: String, file: PathBuf },
}

/// Opens the store at its default place, private unless the caller's
/// config makes it a lab group's shared store ([`store_access`]).
pub fn open_store() -> crate::error::Result<Store> {
    Ok(Store::open_with(&Store::default_root(), store_access()?)?)
}

/// Whether the store is a lab group's shared one: `SIFBOX_STORE_SHARED`
/// (1/true/yes or 0/false/no), else `[store] shared = BOOL` in
/// `$XDG_CONFIG_HOME/sifbox/config.toml` (default ~/.config), else private.
pub(crate) fn store_access() -> sifbox_engine::Result<Access> {
    let bad = |what: String, why: &str| Error::BadInput {
        what,
        why: why.into(),
        fix: "say true or false (1 or 0)".into(),
    };
    if let Ok(v) = std::env::var("SIFBOX_STORE_SHARED") {
        return match v.as_str() {
            "" | "0" | "false" | "no" => Ok(Access::Private),
            "1" | "true" | "yes" => Ok(Access::Group),
            _ => Err(bad(format!("SIFBOX_STORE_SHARED={v}"), "not a yes or no")),
        };
    }
    let Some(dir) = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
    else {
        return Ok(Access::Private);
    };
    let file = dir.join("sifbox/config.toml");
    let Some(table) = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
    else {
        return Ok(Access::Private);
    };
    match table.get("store").and_then(|s| s.get("shared")) {
        None | Some(toml::Value::Boolean(false)) => Ok(Access::Private),
        Some(toml::Value::Boolean(true)) => Ok(Access::Group),
        Some(v) => Err(bad(
            format!("store.shared = {v} in {}", file.display()),
            "not a boolean",
        )),
    }
}

pub fn run(cmd: ImageCommand) -> crate::error::Result<ExitCode> {
    let store = open_store()?;
    match cmd {
        ImageCommand::Ls { json } => {
            let list = store.list()?;
            if json {
                outln!("{}", serde_json::json!({ "images": list }));
            } else {
                outln!("{:<20} {:>10}  NAMES", "DIGEST", "SIZE");
                for i in &list {
                    outln!(
                        "{:<20} {:>10}  {}",
                        &i.digest[..i.digest.len().min(19)],
                        i.size,
                        i.refs.join(", ")
                    );
                }
            }
        }
        ImageCommand::Inspect { reference, json } => {
            let d = store.resolve(&reference)?;
            let entry = store
                .list()?
                .into_iter()
                .find(|e| e.digest == d.as_str())
                .ok_or_else(|| StoreError::NotFound(reference.clone()))?;
            let m = import::image_meta(&store, &d)?;
            let v = serde_json::json!({ "image": entry, "config": m });
            if json {
                outln!("{v}");
            } else {
                outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            }
        }
        ImageCommand::Rm { force, references } => {
            for r in references {
                match store.remove(&r, force) {
                    Ok((d, Removed::Deferred)) => outln!(
                        "removed {r} ({d}); the image itself goes once no sandbox uses it (`sifbox gc`)"
                    ),
                    Ok((d, _)) => outln!("removed {r} ({d})"),
                    Err(StoreError::InUse { digest }) => return Err(in_use(&r, &digest).into()),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        ImageCommand::Tag { reference, name } => {
            let d = store.resolve(&reference)?;
            let name = store.tag(&name, &d)?;
            outln!("{name} -> {d}");
        }
        ImageCommand::Import { source, name } => {
            let r = import::import(&store, &source, name.as_deref())?;
            outln!("{}", r.digest);
        }
        ImageCommand::Export { reference, file } => {
            let d = store.resolve(&reference)?;
            import::export(&store, &d, &file)?;
            outln!("{}", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The error of `image rm` refused for an image in use: the caller's
/// sandboxes that run it by name, else who else can hold it.
fn in_use(reference: &str, digest: &str) -> Error {
    let users: Vec<String> = sifbox_engine::runtime::root()
        .and_then(|root| sifbox_engine::runtime::scan(&root))
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.alive
                && e.state
                    .as_ref()
                    .is_some_and(|s| s.digest.as_deref() == Some(digest))
        })
        .map(|e| e.name)
        .collect();
    let (why, fix) = if users.is_empty() {
        (
            "it is in use by a build, an eval job or a sandbox of another runtime dir".to_string(),
            "wait until it ends, or remove it anyway with `sifbox image rm --force` (the name goes now, the image once unused)".to_string(),
        )
    } else {
        let s = if users.len() == 1 { "" } else { "es" };
        (
            format!("it is in use by the running sandbox{s} {}", users.join(", ")),
            format!(
                "stop {} first (`sifbox stop {}`), or remove it anyway with `sifbox image rm --force` (the name goes now, the image once unused)",
                if users.len() == 1 { "it" } else { "them" },
                users.join(" ")
            ),
        )
    };
    Error::BadInput {
        what: format!("image {reference} ({digest})"),
        why,
        fix,
    }
}

pub use sifbox_registry::Resolved;

/// Resolves an IMAGE argument of a command by the one rule
/// (`sifbox_registry::resolve`): `docker://REF` pulled the first time, a
/// rootfs directory in place, a file imported once, else a store name. The
/// store is opened only when it is needed.
pub fn resolve(arg: &str) -> crate::error::Result<Resolved> {
    let parsed = sifbox_registry::ImageArg::from_cli(arg)?;
    if let Some(tree) = parsed.tree()? {
        return Ok(Resolved::in_place(tree, arg));
    }
    let store = open_store()?;
    let opts = sifbox_registry::ResolveOptions {
        progress: crate::cmd::progress::for_stderr(false),
        ..sifbox_registry::ResolveOptions::default()
    };
    Ok(sifbox_registry::resolve::resolve(
        &store, &parsed, arg, &opts,
    )?)
}

/// Resolves a Dockerfile's `FROM` or a task's `docker_image` in `store`:
/// a store name, else a registry reference pulled on first use.
pub fn resolve_reference(
    store: &Store,
    reference: &str,
) -> Result<Digest, sifbox_registry::ResolveError> {
    let opts = sifbox_registry::ResolveOptions {
        progress: crate::cmd::progress::for_stderr(false),
        ..sifbox_registry::ResolveOptions::default()
    };
    sifbox_registry::resolve::reference(store, reference, &opts)
}
