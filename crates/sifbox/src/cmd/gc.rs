//! `sifbox gc`: remove what dead sandboxes and interrupted imports left
//! (runtime dirs, empty cgroups, lock files nobody holds) and images removed
//! with `image rm --force` that nothing uses any more; with `--blobs`, also unused registry
//! blobs and interrupted downloads; with `--build-cache`, the layers of
//! build steps and their cache mounts. Disk layers' ext4 templates that
//! this host's mkfs.ext4 would not make go too.

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
    /// Also empty the build cache: the layers of build steps and the
    /// `RUN --mount=type=cache` directories (not while builds run).
    #[arg(long = "build-cache")]
    build_cache: bool,
    /// List every file, dir, sandbox and image removed (by default: how
    /// many of each kind).
    #[arg(long, short = 'v')]
    verbose: bool,
}

pub fn run(args: GcArgs) -> crate::error::Result<ExitCode> {
    let root = runtime::root()?;
    let removed = runtime::reap_dead(&root)?;
    let cgroups = stale_cgroups(&root)?;
    let opened = crate::cmd::image::open_store()?;
    let mut store = opened.gc()?;
    let mut pruned = Vec::new();
    if !store.unremovable.is_empty() || args.build_cache {
        // Build steps leave files of the caller's subordinate ids, which
        // only a sandbox with the same id mapping can remove.
        let exe = std::env::current_exe()
            .map_err(|e| sifbox_engine::Error::io("finding the sifbox binary", e))?;
        let layers =
            sifbox_build::layers::Layers::new(&opened, exe, sifbox_engine::spec::UsernsMode::Auto)?;
        let unremovable = std::mem::take(&mut store.unremovable);
        layers.remove_trees(&unremovable)?;
        for p in unremovable {
            // Nobody holds a dead work dir's lock; unlinked the one safe way.
            let _ = sifbox_sys::lockfile::remove_if_unheld(&p.with_extension("lock"));
            store.temp_dirs.push(p);
        }
        if args.build_cache {
            pruned = layers.prune()?;
        }
    }
    // Disk layers' ext4 templates no mkfs here would use.
    let templates = sifbox_engine::disk::gc_templates(&sifbox_engine::disk::scratch_dir(
        &Store::default_root().join("scratch"),
    ));
    let blobs = if args.blobs {
        Some(opened.gc_blobs()?)
    } else {
        None
    };
    if args.json {
        outln!(
            "{}",
            serde_json::json!({ "removed_sandboxes": removed, "cgroups": cgroups, "store": store, "blobs": blobs, "build_cache": pruned, "disk_templates": templates })
        );
        return Ok(ExitCode::SUCCESS);
    }
    let shown = |paths: &[std::path::PathBuf]| -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    };
    let deferred: Vec<String> = store
        .deferred_images
        .iter()
        .map(|d| format!("{d} (removed with --force while in use)"))
        .collect();
    // Each kind: how many went (a healthy store has dozens of lock files
    // nobody holds: a count, not a line each), with `-v` each one.
    let kinds: [(&str, &str, Vec<String>); 10] = [
        ("dead sandbox", "dead sandboxes", removed.clone()),
        ("empty cgroup", "empty cgroups", shown(&cgroups)),
        ("image", "images", deferred),
        (
            "lock file nobody held",
            "lock files nobody held",
            shown(&store.stale_locks),
        ),
        ("temporary dir", "temporary dirs", shown(&store.temp_dirs)),
        (
            "unpacked tree of no image",
            "unpacked trees of no image",
            shown(&store.unpacked_without_image),
        ),
        (
            "source record of no image",
            "source records of no image",
            shown(&store.stale_sources),
        ),
        (
            "registry blob",
            "registry blobs",
            blobs.as_ref().map_or_else(Vec::new, |b| shown(&b.removed)),
        ),
        ("build cache entry", "build cache entries", shown(&pruned)),
        (
            "disk-layer template",
            "disk-layer templates",
            shown(&templates),
        ),
    ];
    let mut any = false;
    for (one, many, items) in &kinds {
        if items.is_empty() {
            continue;
        }
        any = true;
        if args.verbose {
            for item in items {
                outln!("removed {one} {item}");
            }
        } else {
            let n = items.len();
            outln!("removed {n} {}", if n == 1 { one } else { many });
        }
    }
    if !any {
        outln!("nothing to clean up");
    } else if !args.verbose {
        outln!("(`sifbox gc -v` lists them)");
    }
    Ok(ExitCode::SUCCESS)
}

/// Removes the empty cgroups of sandboxes this runtime dir no longer has
/// (live and starting ones keep theirs; a minute's grace covers a sandbox
/// between making its cgroup and starting in it).
fn stale_cgroups(root: &runtime::Root) -> sifbox_engine::Result<Vec<std::path::PathBuf>> {
    use sifbox_engine::limits::cgroup;
    let Some(h) = cgroup::Hierarchy::detect(std::path::Path::new(cgroup::MOUNT_ROOT)) else {
        return Ok(Vec::new());
    };
    let live: Vec<String> = runtime::scan(root)?.into_iter().map(|e| e.name).collect();
    Ok(cgroup::gc(
        &h,
        &|name| live.iter().any(|l| l == name),
        std::time::Duration::from_secs(60),
    ))
}
