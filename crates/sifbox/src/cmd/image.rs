//! `sifbox image ...`: the image store, and how IMAGE arguments resolve.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sifbox_eval::result::rfc3339_secs;
use sifbox_image::import;

use crate::cmd::options::bad;
use sifbox_image::store::{Digest, Removed, Store, StoreError};

#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// List the images in the store: digest, size, creation time, names.
    Ls {
        /// Print them as JSON: sizes in bytes, times in Unix seconds.
        #[arg(long)]
        json: bool,
    },
    /// Show an image: digest, names, size, creation time, metadata.
    Inspect {
        /// The image: NAME[:TAG], a digest or a unique digest prefix.
        #[arg(value_name = "IMAGE")]
        reference: String,
        /// Print it as JSON: the size in bytes, the time in Unix seconds.
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
        /// Names (NAME[:TAG]) or digests to remove.
        #[arg(required = true, value_name = "IMAGE")]
        references: Vec<String>,
    },
    /// Give an image another NAME[:TAG].
    Tag {
        /// The image: NAME[:TAG], a digest or a unique digest prefix.
        #[arg(value_name = "IMAGE")]
        reference: String,
        /// The new name (the tag defaults to latest).
        #[arg(value_name = "NAME[:TAG]")]
        name: String,
    },
    /// Import a .sif, a rootfs directory or tarball, an OCI layout or
    /// archive, or a docker-archive; prints the digest.
    Import {
        /// What to import: a .sif, a rootfs directory or tar(.gz|.zst), an
        /// OCI layout or oci-archive, a docker-archive (`docker save`).
        #[arg(value_name = "SOURCE")]
        source: PathBuf,
        /// Name the image (the tag defaults to latest).
        #[arg(long, value_name = "NAME[:TAG]")]
        name: Option<String>,
    },
    /// Write an image as a SIF file that Apptainer runs.
    Export {
        /// The image: NAME[:TAG], a digest or a unique digest prefix.
        #[arg(value_name = "IMAGE")]
        reference: String,
        /// The SIF file to write.
        #[arg(value_name = "FILE.sif")]
        file: PathBuf,
    },
}

/// Opens the store at its default place, private unless the caller's
/// config makes it a lab group's shared store (`sifbox_launch::store`).
pub fn open_store() -> crate::error::Result<Store> {
    Ok(sifbox_launch::store::open()?)
}

pub fn run(cmd: ImageCommand) -> crate::error::Result<ExitCode> {
    let store = open_store()?;
    match cmd {
        ImageCommand::Ls { json } => {
            let list = store.list()?;
            if json {
                outln!("{}", serde_json::json!({ "images": list }));
            } else {
                outln!("{:<20} {:>8}  {:<20}  NAMES", "DIGEST", "SIZE", "CREATED");
                for i in &list {
                    outln!(
                        "{:<20} {:>8}  {:<20}  {}",
                        &i.digest[..i.digest.len().min(19)],
                        human_size(i.size),
                        rfc3339_secs(i.created),
                        // Untagged: Docker's `<none>`, not a blank.
                        if i.refs.is_empty() {
                            "<none>".to_string()
                        } else {
                            i.refs.join(", ")
                        }
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
            let mut v = serde_json::json!({ "image": entry, "config": m });
            if json {
                outln!("{v}");
            } else {
                // The same document, its size and time made readable.
                v["image"]["size"] = human_size(entry.size).into();
                v["image"]["created"] = rfc3339_secs(entry.created).into();
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
                    Err(StoreError::InUse { digest }) => return Err(in_use(&r, &digest)),
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
            export_to(&store, &d, &file, "image export")?;
            outln!("{}", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A size for people, as Docker prints it: three significant digits in
/// decimal units (1 kB = 1000 bytes, 1 MB = 1000 kB, ...), trailing zeros
/// dropped: `999 B`, `1.23 kB`, `148 MB`, `2 GB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["kB", "MB", "GB", "TB", "PB", "EB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let n = u128::from(bytes);
    let (mut k, mut unit) = (0, 1000u128);
    while n >= unit * 1000 && k + 1 < UNITS.len() {
        unit *= 1000;
        k += 1;
    }
    // Rounded half up to three significant digits; a carry (999.5 kB)
    // takes a digit from the fraction, or moves to the next unit.
    let rounded = |dec: u32, unit: u128| (n * 10u128.pow(dec) + unit / 2) / unit;
    let whole = n / unit;
    let mut dec: u32 = match whole {
        100.. => 0,
        10..=99 => 1,
        _ => 2,
    };
    let mut scaled = rounded(dec, unit);
    if scaled >= 1000 {
        if dec > 0 {
            dec -= 1;
        } else if k + 1 < UNITS.len() {
            k += 1;
            unit *= 1000;
            dec = 2;
        }
        scaled = rounded(dec, unit);
    }
    let p = 10u128.pow(dec);
    let mut number = format!("{}", scaled / p);
    if dec > 0 {
        let frac = format!("{:0width$}", scaled % p, width = dec as usize);
        let frac = frac.trim_end_matches('0');
        if !frac.is_empty() {
            number = format!("{number}.{frac}");
        }
    }
    format!("{number} {}", UNITS[k])
}

/// The error of `image rm` refused for an image in use: the caller's
/// sandboxes that run it by name, else who else can hold it.
fn in_use(reference: &str, digest: &str) -> crate::error::CliError {
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
    crate::error::CliError::usage(format!("image {reference} ({digest})"), why, fix)
}

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
        ));
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
        ));
    }
    import::export(store, d, out).map_err(|e| {
        let why = match &e {
            import::ImportError::Source { message, .. } => message.clone(),
            other => other.to_string(),
        };
        bad(&what, &why, "give a path you can write")
    })
}

#[cfg(test)]
mod tests {
    use super::human_size;

    #[test]
    fn sizes_read_as_docker_prints_them() {
        for (bytes, want) in [
            (0, "0 B"),
            (999, "999 B"),
            (1000, "1 kB"),
            (1234, "1.23 kB"),
            (9_995, "10 kB"),
            (99_950, "100 kB"),
            (999_499, "999 kB"),
            (999_500, "1 MB"),
            (5_600_000, "5.6 MB"),
            (148_123_456, "148 MB"),
            (2_000_000_000, "2 GB"),
            (u64::MAX, "18.4 EB"),
        ] {
            assert_eq!(human_size(bytes), want, "{bytes}");
        }
    }
}
