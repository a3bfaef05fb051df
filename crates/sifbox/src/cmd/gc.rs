//! `sifbox gc`: remove what dead sandboxes and interrupted imports left.

use std::process::ExitCode;

use sifbox_engine::runtime;
use sifbox_image::store::Store;

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: GcArgs) -> sifbox_engine::Result<ExitCode> {
    let root = runtime::root()?;
    let removed = runtime::reap_dead(&root)?;
    let store =
        Store::open_default()
            .and_then(|s| s.gc())
            .map_err(|e| sifbox_engine::Error::BadInput {
                what: format!("image store {}", Store::default_root().display()),
                why: e.to_string(),
                fix: "set SIFBOX_CACHE to a writable directory".into(),
            })?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "removed_sandboxes": removed, "store": store })
        );
        return Ok(ExitCode::SUCCESS);
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
    {
        println!("nothing to clean up");
    }
    Ok(ExitCode::SUCCESS)
}
