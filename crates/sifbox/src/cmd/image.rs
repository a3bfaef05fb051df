//! `sifbox image ...`: the image store, and how IMAGE arguments resolve.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sifbox_engine::Error;
use sifbox_image::import;

use crate::cmd::options::bad;
use sifbox_image::store::{Access, Digest, Store, StoreError};

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
    /// Remove names (and the image once no name is left, or when given by digest).
    Rm {
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
        ImageCommand::Rm { references } => {
            for r in references {
                let d = store.remove(&r)?;
                outln!("removed {r} ({d})");
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
            export_to(&store, &d, &file, "image export")?;
            outln!("{}", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub use sifbox_registry::Resolved;

/// Writes the stored image `d` as the SIF file `out`, for `what` (the
/// command or flag, in messages): a directory, a missing parent or a path
/// that cannot be written is bad input that says so.
pub fn export_to(store: &Store, d: &Digest, out: &Path, what: &str) -> crate::error::Result<()> {
    let shown = out.display().to_string();
    let what = format!("{what} {shown}");
    if shown.ends_with('/') || out.is_dir() {
        return Err(bad(
            &what,
            "is a directory",
            &format!(
                "give the file to write, e.g. {}/IMAGE.sif",
                shown.trim_end_matches('/')
            ),
        )
        .into());
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(bad(
            &what,
            &format!("{} is not a directory", parent.display()),
            "create it first, or give a path in an existing directory",
        )
        .into());
    }
    import::export(store, d, out).map_err(|e| {
        let why = match &e {
            import::ImportError::Source { message, .. } => message.clone(),
            other => other.to_string(),
        };
        crate::error::CliError::from(bad(&what, &why, "give a path you can write"))
    })
}

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
