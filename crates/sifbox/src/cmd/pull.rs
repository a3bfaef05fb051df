//! `sifbox pull [docker://]REF`: an image from a registry into the store;
//! also what `docker://REF` as IMAGE does the first time.

use std::process::ExitCode;

use sifbox_image::layer::Platform;
use sifbox_image::store::Store;
use sifbox_registry::{Credentials, PullOptions, Pulled, Reference};

use crate::cmd::progress;

#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// The image: [docker://][REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST]
    /// (Docker Hub and `library/` by default, tag `latest`).
    reference: String,
    /// The platform to pick from a multi-platform image (default: this host's).
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    platform: Option<String>,
    /// Log in with these credentials (else ~/.docker/config.json,
    /// $REGISTRY_AUTH_FILE and credential helpers are used).
    #[arg(long, value_name = "USER:PASSWORD")]
    creds: Option<String>,
    /// Allow plain HTTP and unverified TLS for this registry (always
    /// allowed for localhost and 127.0.0.1).
    #[arg(long)]
    insecure: bool,
    /// Print nothing but the digest.
    #[arg(long, short)]
    quiet: bool,
}

fn bad_input(what: &str, why: String, fix: &str) -> crate::error::CliError {
    crate::error::CliError::usage(what, why, fix)
}

pub fn run(a: PullArgs) -> crate::error::Result<ExitCode> {
    let reference = Reference::parse(&a.reference).map_err(|e| {
        bad_input(
            &format!("pull {}", a.reference),
            e.reason,
            "write it as [REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST]",
        )
    })?;
    let platform = a
        .platform
        .as_deref()
        .map(str::parse::<Platform>)
        .transpose()
        .map_err(|e| bad_input("--platform", e, "give OS/ARCH[/VARIANT], e.g. linux/arm64"))?;
    let creds = a
        .creds
        .as_deref()
        .map(Credentials::parse)
        .transpose()
        .map_err(|e| bad_input("--creds", e, "give USER:PASSWORD"))?;
    let opts = PullOptions {
        platform,
        creds,
        insecure: a.insecure,
        ..PullOptions::default()
    };
    let store = crate::cmd::image::open_store()?;
    let pulled = pull(&store, &reference, &opts, a.quiet)?;
    if !a.quiet {
        let name = pulled
            .name
            .clone()
            .unwrap_or_else(|| format!("{reference} (untagged)"));
        let how = if pulled.cached {
            "up to date".to_string()
        } else {
            format!(
                "{} blobs downloaded ({:.1} MiB), {} cached",
                pulled.blobs_downloaded,
                progress::mib(pulled.downloaded),
                pulled.blobs_cached
            )
        };
        eprintln!("pulled {name} ({how})");
    }
    outln!("{}", pulled.digest);
    Ok(ExitCode::SUCCESS)
}

/// Pulls with progress on stderr (none when `quiet`).
pub fn pull(
    store: &Store,
    reference: &Reference,
    opts: &PullOptions,
    quiet: bool,
) -> crate::error::Result<Pulled> {
    Ok(sifbox_registry::pull(
        store,
        reference,
        opts,
        progress::for_stderr(quiet),
    )?)
}
