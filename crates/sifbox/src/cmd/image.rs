//! `sifbox image ...`: the image store, and how IMAGE arguments resolve.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sifbox_engine::Error;
use sifbox_image::import::{self, SourceKind};
use sifbox_image::meta::{self, ImageMeta};
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

fn store_err(e: impl std::fmt::Display) -> Error {
    Error::BadInput {
        what: "image store".into(),
        why: e.to_string(),
        fix: "check the reference with `sifbox image ls`, or SIFBOX_CACHE".into(),
    }
}

/// Opens the store at its default place, private unless the caller's
/// config makes it a lab group's shared store ([`store_access`]).
pub fn open_store() -> sifbox_engine::Result<Store> {
    let root = Store::default_root();
    Store::open_with(&root, store_access()?).map_err(|e| Error::BadInput {
        what: format!("image store {}", root.display()),
        fix: match e {
            StoreError::NotYours { .. } => "use a store of your own (unset SIFBOX_CACHE), or, for a lab group's shared store, set `store.shared = true` in ~/.config/sifbox/config.toml (or SIFBOX_STORE_SHARED=1)".into(),
            _ => "set SIFBOX_CACHE to a writable directory".into(),
        },
        why: e.to_string(),
    })
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

pub fn run(cmd: ImageCommand) -> sifbox_engine::Result<ExitCode> {
    let store = open_store()?;
    match cmd {
        ImageCommand::Ls { json } => {
            let list = store.list().map_err(store_err)?;
            if json {
                println!("{}", serde_json::json!({ "images": list }));
            } else {
                println!("{:<20} {:>10}  NAMES", "DIGEST", "SIZE");
                for i in &list {
                    println!(
                        "{:<20} {:>10}  {}",
                        &i.digest[..i.digest.len().min(19)],
                        i.size,
                        i.refs.join(", ")
                    );
                }
            }
        }
        ImageCommand::Inspect { reference, json } => {
            let d = store.resolve(&reference).map_err(store_err)?;
            let entry = store
                .list()
                .map_err(store_err)?
                .into_iter()
                .find(|e| e.digest == d.as_str())
                .ok_or_else(|| store_err(format!("{reference}: vanished")))?;
            let m = import::image_meta(&store, &d).map_err(store_err)?;
            let v = serde_json::json!({ "image": entry, "config": m });
            if json {
                println!("{v}");
            } else {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            }
        }
        ImageCommand::Rm { references } => {
            for r in references {
                let d = store.remove(&r).map_err(store_err)?;
                println!("removed {r} ({d})");
            }
        }
        ImageCommand::Tag { reference, name } => {
            let d = store.resolve(&reference).map_err(store_err)?;
            let name = store.tag(&name, &d).map_err(store_err)?;
            println!("{name} -> {d}");
        }
        ImageCommand::Import { source, name } => {
            let r = import::import(&store, &source, name.as_deref()).map_err(|e| Error::BadInput {
                what: format!("import {}", source.display()),
                why: e.to_string(),
                fix: "pass a .sif, a rootfs directory or tarball, an OCI layout or archive, or a docker-archive".into(),
            })?;
            println!("{}", r.digest);
        }
        ImageCommand::Export { reference, file } => {
            let d = store.resolve(&reference).map_err(store_err)?;
            import::export(&store, &d, &file).map_err(store_err)?;
            println!("{}", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// An IMAGE argument, resolved to a root file system for the engine.
#[derive(Debug)]
pub struct Resolved {
    pub rootfs: PathBuf,
    pub meta: ImageMeta,
    /// As the caller named it.
    pub reference: String,
    pub digest: Option<Digest>,
    /// The image carries Apptainer env scripts (and no sifbox metadata):
    /// commands must source them.
    pub env_scripts: bool,
}

/// Resolves IMAGE: `docker://REF` from the store, pulled the first time; a
/// rootfs directory as it is; a file (a `.sif`, a tarball, an OCI or docker
/// archive) imported into the store (once); else a store reference
/// (NAME[:TAG], digest, digest prefix).
pub fn resolve(arg: &str) -> sifbox_engine::Result<Resolved> {
    let bad = |why: String| Error::BadInput {
        what: format!("image {arg}"),
        why,
        fix: "pass a rootfs directory, a .sif or image archive, or a name from `sifbox image ls`"
            .into(),
    };
    if arg.starts_with("docker://") {
        let reference = sifbox_registry::Reference::parse(arg).map_err(|e| Error::BadInput {
            what: format!("image {arg}"),
            why: e.reason,
            fix: "write it as docker://[REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST]".into(),
        })?;
        let store = open_store()?;
        let d = match sifbox_registry::find_pulled(&store, &reference, None) {
            Some(d) => d,
            None => {
                let opts = sifbox_registry::PullOptions::default();
                crate::cmd::pull::pull(&store, &reference, &opts, false)?.digest
            }
        };
        return from_store(&store, d, arg);
    }
    let path = Path::new(arg);
    if path.exists() {
        if matches!(import::classify(path), Ok(SourceKind::RootfsDir)) {
            let rootfs = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
            return Ok(Resolved {
                env_scripts: meta::has_env_scripts(&rootfs),
                rootfs,
                meta: ImageMeta::default(),
                reference: arg.to_string(),
                digest: None,
            });
        }
        let store = open_store()?;
        let imported = import::import(&store, path, None).map_err(|e| bad(e.to_string()))?;
        return from_store(&store, imported.digest, arg);
    }
    let store = open_store()?;
    let d = store.resolve(arg).map_err(|e| bad(e.to_string()))?;
    from_store(&store, d, arg)
}

fn from_store(store: &Store, d: Digest, arg: &str) -> sifbox_engine::Result<Resolved> {
    let bad = |why: String| Error::BadInput {
        what: format!("image {arg}"),
        why,
        fix: "re-import it, or run `sifbox gc` and try again".into(),
    };
    let meta = import::image_meta(store, &d).map_err(|e| bad(e.to_string()))?;
    let rootfs = import::rootfs(store, &d).map_err(|e| bad(e.to_string()))?;
    let foreign = meta == ImageMeta::default();
    Ok(Resolved {
        env_scripts: foreign && meta::has_env_scripts(&rootfs),
        rootfs,
        meta,
        reference: arg.to_string(),
        digest: Some(d),
    })
}
