//! `sifbox gc`: remove what dead sandboxes and interrupted imports left;
//! with `--blobs`, also unused registry blobs and interrupted downloads.

use std::process::ExitCode;

use sifbox_engine::runtime;
use sifbox_image::store::Store;

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Also empty the registry blob cache of blobs no stored image was
    /// pulled from, and of interrupted downloads (which a later pull would
    /// otherwise continue).
    #[arg(long)]
    blobs: bool,
}

pub fn run(args: GcArgs) -> sifbox_engine::Result<ExitCode> {
    let root = runtime::root()?;
    let removed = runtime::reap_dead(&root)?;
    let store_err = |e: sifbox_image::store::StoreError| sifbox_engine::Error::BadInput {
        what: format!("image store {}", Store::default_root().display()),
        why: e.to_string(),
        fix: "set SIFBOX_CACHE to a writable directory".into(),
    };
    let opened = Store::open_default().map_err(store_err)?;
    let store = opened.gc().map_err(store_err)?;
    let blobs = if args.blobs {
        Some(opened.gc_blobs().map_err(store_err)?)
    } else {
        None
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "removed_sandboxes": removed, "store": store, "blobs": blobs })
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(b) = &blobs {
        for p in &b.removed {
            println!("removed {}", p.display());
        }
    }
    for name in &removed {
        println!("removed dead sandbox {name}");
    }
    for p in store
        .temp_dirs
        .iter()
        .chain(&store.unpacked_without_image)
        .chain(&store.stale_sources)
    {
        println!("removed {}", p.display());
    }
    if removed.is_empty()
        && store.temp_dirs.is_empty()
        && store.unpacked_without_image.is_empty()
        && store.stale_sources.is_empty()
        && blobs.as_ref().is_none_or(|b| b.removed.is_empty())
    {
        println!("nothing to clean up");
    }
    Ok(ExitCode::SUCCESS)
}
