//! Pulling an image into the store.
//!
//! 1. Fetch the manifest by tag or digest; from an index (or manifest
//!    list) pick the one for the platform and fetch it by digest. Both are
//!    checked against their digests.
//! 2. If an image was already made from that manifest, tag it: done.
//! 3. Otherwise take the manifest's lock (concurrent pulls of one image do
//!    the work once), download the config and the layers in parallel into
//!    the blob cache (each blob once across processes, verified, a partial
//!    download continued with a Range request), assemble an OCI layout of
//!    hard links to the cached blobs in a work dir, and import it through
//!    [`sifbox_image::import::import_layers`], the path every layered
//!    import takes.
//!
//! Nothing enters `images/`, `refs/` or `blobs/sha256/` unverified; an
//! interrupted pull leaves finished blobs and the partial file of the blob
//! it was downloading, which the next pull continues.

use std::path::Path;
use std::sync::Arc;

use sifbox_image::import;
use sifbox_image::layer::{BlobDescriptor, Manifest, Platform};
use sifbox_image::squash;
use sifbox_image::store::{self, Reuse, Store};

use crate::client::{Client, Fetched, RetryPolicy};
use crate::credentials::{self, Credentials};
use crate::error::PullError;
use crate::progress::{BlobOutcome, Progress};
use crate::reference::Reference;

/// How a pull goes.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The platform to pick from an index; the host's by default.
    pub platform: Option<Platform>,
    /// Credentials (else the config files and helpers are asked).
    pub creds: Option<Credentials>,
    /// Allow plain HTTP and unverified TLS for this registry.
    pub insecure: bool,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// Blobs downloaded at once.
    pub jobs: usize,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            platform: None,
            creds: None,
            insecure: false,
            retry: RetryPolicy::default(),
            jobs: 4,
        }
    }
}

/// The result of a pull.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The image in the store.
    pub digest: store::Digest,
    /// The name it was tagged with (a reference with a tag).
    pub name: Option<String>,
    /// The platform manifest it was made from.
    pub manifest: String,
    /// The store already had an image made from that manifest.
    pub cached: bool,
    /// Bytes downloaded by this pull.
    pub downloaded: u64,
    /// Blobs found in the cache / downloaded.
    pub blobs_cached: usize,
    pub blobs_downloaded: usize,
}

/// The source record of an image pulled from manifest `digest`.
fn source_key(manifest: &str) -> String {
    format!("pull:{manifest}")
}

/// The source record of an image pulled through an index by digest.
fn index_key(index: &str, platform: &Platform) -> String {
    format!("pull:{index}:{platform}")
}

/// The stored image `reference` names, if it was pulled before (a tag in
/// the store, or a digest pulled for this platform): no registry is asked.
#[must_use]
pub fn find_pulled(
    store: &Store,
    reference: &Reference,
    platform: Option<&Platform>,
) -> Option<store::Digest> {
    if let Some(d) = reference.digest() {
        let p = platform.cloned().unwrap_or_else(Platform::host);
        return store
            .recall_source(&source_key(d))
            .or_else(|| store.recall_source(&index_key(d, &p)));
    }
    let name = reference.store_name()?;
    store.resolve(&name).ok()
}

/// Pulls `reference` into `store`. Blocks; runs its own small async
/// runtime for the downloads and stops it (its threads included) before
/// returning.
///
/// # Errors
///
/// A [`PullError`] naming the reference and what failed; nothing but
/// verified blobs and the partial file of an interrupted download is left.
pub fn pull(
    store: &Store,
    reference: &Reference,
    opts: &PullOptions,
    progress: Arc<dyn Progress>,
) -> Result<Pulled, PullError> {
    let refname = reference.to_string();
    let store_err = |e: store::StoreError| PullError::Store {
        reference: refname.clone(),
        source: e,
    };
    let creds = match &opts.creds {
        Some(c) => Some(c.clone()),
        None => credentials::lookup(reference.registry())
            .map_err(|message| PullError::Credentials {
                reference: refname.clone(),
                message,
            })?
            .map(|f| {
                tracing::debug!(source = %f.source, "registry credentials");
                f.credentials
            }),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sifbox-pull")
        .enable_all()
        .build()
        .map_err(|e| PullError::Transport {
            reference: refname.clone(),
            what: "starting the download threads".into(),
            message: e.to_string(),
            attempts: 1,
        })?;
    let platform = opts.platform.clone().unwrap_or_else(Platform::host);
    let started = std::time::Instant::now();
    let resolved = rt.block_on(resolve(reference, creds, opts, &platform))?;
    tracing::debug!(elapsed = ?started.elapsed(), manifest = %resolved.manifest.digest, "resolved");
    let manifest_digest = resolved.manifest.digest.to_string();
    let finish_cached = |d: store::Digest| -> Result<Pulled, PullError> {
        let name = tag(store, reference, &d, &resolved, &platform).map_err(store_err)?;
        Ok(Pulled {
            digest: d,
            name,
            manifest: manifest_digest.clone(),
            cached: true,
            downloaded: 0,
            blobs_cached: 0,
            blobs_downloaded: 0,
        })
    };
    // Made once per manifest (see `Store::make_once`): the downloads, the
    // layout and the import, under its lock.
    enum Made {
        Store(store::StoreError),
        Pull(PullError),
    }
    impl From<store::StoreError> for Made {
        fn from(e: store::StoreError) -> Made {
            Made::Store(e)
        }
    }
    let mut outcomes: Vec<BlobOutcome> = Vec::new();
    let made = store.make_once(&source_key(&manifest_digest), Reuse::Yes, || {
        let make = || -> Result<store::Digest, PullError> {
            let mut blobs = vec![resolved.config.clone()];
            blobs.extend(resolved.layers.iter().cloned());
            progress.resolved(&manifest_digest, &blobs);
            // A platform asked for, and no index to choose from: the config says
            // what the image is for; check it before the layers come.
            let mut config_outcome = None;
            if let (Some(want), None) = (&opts.platform, &resolved.index) {
                config_outcome = rt
                    .block_on(download_all(
                        store,
                        &resolved.client,
                        std::slice::from_ref(&resolved.config),
                        1,
                        &progress,
                    ))?
                    .pop();
                check_platform(store, &resolved.config, want).map_err(|message| {
                    PullError::Invalid {
                        reference: refname.clone(),
                        message,
                    }
                })?;
            }
            let rest = if config_outcome.is_some() {
                &blobs[1..]
            } else {
                &blobs[..]
            };
            let mut got = rt.block_on(download_all(
                store,
                &resolved.client,
                rest,
                opts.jobs.max(1),
                &progress,
            ))?;
            if let Some(o) = config_outcome {
                got.insert(0, o);
            }
            outcomes = got;
            // The downloads are done: no thread of the runtime outlives them.
            drop(rt);

            // The manifest itself, as fetched (it was checked against its digest).
            let mdigest = store::Digest::parse_sha256(&manifest_digest).ok_or_else(|| {
                PullError::Invalid {
                    reference: refname.clone(),
                    message: format!("manifest {manifest_digest}: only sha256 is supported"),
                }
            })?;
            {
                let _l = store.lock_blob(&mdigest).map_err(store_err)?;
                if !store.has_blob(&mdigest) {
                    let mut w = store.blob_writer(&mdigest, None).map_err(store_err)?;
                    w.write(&resolved.manifest.bytes).map_err(store_err)?;
                    w.finish().map_err(store_err)?;
                }
            }

            tracing::debug!(elapsed = ?started.elapsed(), "blobs in the cache");
            progress.step(&format!("unpacking {} layers", resolved.layers.len()));
            let work = store.work_dir("pull").map_err(store_err)?;
            let layout = work.path().join("layout");
            assemble_layout(store, &layout, &resolved.manifest, &blobs).map_err(|e| {
                PullError::Store {
                    reference: refname.clone(),
                    source: e,
                }
            })?;
            // Entry times clamped to SOURCE_DATE_EPOCH when set, else to the newest
            // the layers carry: the same image gives the same SIF anywhere. Level 6
            // (as builds use): about 3x faster than 9 for a few percent more bytes,
            // on the path of every `run docker://` of a new image.
            let layers_opts = import::LayersOptions {
                clamp: squash::PackOptions::from_env().clamp_mtime,
                level: Some(6),
                blobs_verified: true,
            };
            let digest =
                import::import_layers(store, &layout, &work, layers_opts).map_err(|e| {
                    PullError::Import {
                        reference: refname.clone(),
                        source: e,
                    }
                })?;
            tracing::debug!(elapsed = ?started.elapsed(), image = %digest, "imported");
            let mut used: Vec<store::Digest> = vec![mdigest];
            used.extend(
                blobs
                    .iter()
                    .filter_map(|b| store::Digest::parse_sha256(&b.digest.to_string())),
            );
            store
                .record_image_blobs(&digest, &used)
                .map_err(store_err)?;
            Ok(digest)
        };
        make().map_err(Made::Pull)
    });
    let digest = match made {
        Ok((d, true)) => return finish_cached(d),
        Ok((d, false)) => d,
        Err(Made::Store(e)) => return Err(store_err(e)),
        Err(Made::Pull(e)) => return Err(e),
    };
    let name = tag(store, reference, &digest, &resolved, &platform).map_err(store_err)?;
    let mut downloaded = 0;
    let (mut cached, mut fetched) = (0, 0);
    for o in &outcomes {
        match o {
            BlobOutcome::Cached => cached += 1,
            BlobOutcome::Downloaded { bytes, .. } => {
                fetched += 1;
                downloaded += bytes;
            }
        }
    }
    Ok(Pulled {
        digest,
        name,
        manifest: manifest_digest,
        cached: false,
        downloaded,
        blobs_cached: cached,
        blobs_downloaded: fetched,
    })
}

/// Whether the image config in the blob cache names a platform that suits
/// `want` (one that names none suits any).
fn check_platform(store: &Store, config: &BlobDescriptor, want: &Platform) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(default)]
        os: String,
        #[serde(default)]
        architecture: String,
        #[serde(default)]
        variant: Option<String>,
    }
    let path = store::Digest::parse_sha256(&config.digest.to_string())
        .map(|d| store.blob_path(&d))
        .ok_or_else(|| format!("config {}: only sha256 is supported", config.digest))?;
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let c: Config = serde_json::from_slice(&bytes)
        .map_err(|e| format!("config {}: invalid JSON: {e}", config.digest))?;
    if c.os.is_empty() || c.architecture.is_empty() {
        return Ok(());
    }
    let variant_ok = match (&want.variant, &c.variant) {
        (Some(w), Some(h)) => w == h,
        _ => true,
    };
    if c.os == want.os && c.architecture == want.architecture && variant_ok {
        return Ok(());
    }
    let have = Platform {
        os: c.os,
        architecture: c.architecture,
        variant: c.variant.filter(|v| !v.is_empty()),
    };
    Err(format!(
        "the image is for {have}, not {want} (it is a single-platform image: drop --platform to take it)"
    ))
}

/// Names the image after the reference's tag and records an index digest.
fn tag(
    store: &Store,
    reference: &Reference,
    image: &store::Digest,
    resolved: &Resolved,
    platform: &Platform,
) -> Result<Option<String>, store::StoreError> {
    if let Some(index) = &resolved.index {
        store.remember_source(&index_key(index, platform), image)?;
    }
    reference
        .store_name()
        .map(|n| store.tag(&n, image))
        .transpose()
}

#[derive(Debug)]
struct Resolved {
    client: Arc<Client>,
    manifest: Fetched,
    /// The digest of the index the manifest was picked from.
    index: Option<String>,
    config: BlobDescriptor,
    layers: Vec<BlobDescriptor>,
}

async fn resolve(
    reference: &Reference,
    creds: Option<Credentials>,
    opts: &PullOptions,
    platform: &Platform,
) -> Result<Resolved, PullError> {
    let refname = reference.to_string();
    let invalid = |e: sifbox_image::layer::Error| PullError::Invalid {
        reference: refname.clone(),
        message: e.to_string(),
    };
    let client =
        Arc::new(Client::connect(reference, creds, opts.insecure, opts.retry.clone()).await?);
    let mut fetched = client.manifest(reference.manifest_ref()).await?;
    let mut index = None;
    for _ in 0..3 {
        let what = format!("manifest {}", fetched.digest);
        match Manifest::parse(&fetched.bytes, &what).map_err(invalid)? {
            Manifest::Index(_) => {
                let chosen =
                    Manifest::select(&fetched.bytes, Some(platform), &what).map_err(invalid)?;
                index.get_or_insert_with(|| fetched.digest.to_string());
                fetched = client.manifest(&chosen.digest.to_string()).await?;
            }
            Manifest::Image { config, layers } => {
                return Ok(Resolved {
                    client,
                    manifest: fetched,
                    index,
                    config,
                    layers,
                });
            }
        }
    }
    Err(PullError::Invalid {
        reference: refname,
        message: "image indexes nested too deep".into(),
    })
}

async fn download_all(
    store: &Store,
    client: &Arc<Client>,
    blobs: &[BlobDescriptor],
    jobs: usize,
    progress: &Arc<dyn Progress>,
) -> Result<Vec<BlobOutcome>, PullError> {
    let sem = Arc::new(tokio::sync::Semaphore::new(jobs));
    let mut tasks = tokio::task::JoinSet::new();
    let mut seen = std::collections::HashSet::new();
    for (i, b) in blobs.iter().enumerate() {
        // The same layer twice in one image is downloaded once.
        if !seen.insert(b.digest.clone()) {
            continue;
        }
        let (store, client, progress, b, sem) = (
            store.clone(),
            client.clone(),
            progress.clone(),
            b.clone(),
            sem.clone(),
        );
        tasks.spawn(async move {
            let _permit = sem.acquire_owned().await;
            (i, client.blob(&store, &b, &progress).await)
        });
    }
    let mut out = Vec::new();
    let mut first_err = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, Ok(o))) => out.push((i, o)),
            Ok((_, Err(e))) => {
                if first_err.is_none() {
                    first_err = Some(e);
                    // Stop the others: their partial files stay for the
                    // next pull.
                    tasks.abort_all();
                }
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                first_err.get_or_insert(PullError::Invalid {
                    reference: String::new(),
                    message: format!("a download task failed: {e}"),
                });
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, o)| o).collect())
}

/// Writes an OCI layout at `dir` whose blobs are hard links to the cache.
fn assemble_layout(
    store: &Store,
    dir: &Path,
    manifest: &Fetched,
    blobs: &[BlobDescriptor],
) -> Result<(), store::StoreError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| store::StoreError::Io { path: p, source }
    };
    let blob_dir = dir.join("blobs").join("sha256");
    std::fs::create_dir_all(&blob_dir).map_err(io(&blob_dir))?;
    let oci_layout = dir.join("oci-layout");
    std::fs::write(&oci_layout, br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io(&oci_layout))?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": manifest.media_type,
            "digest": manifest.digest.to_string(),
            "size": manifest.bytes.len(),
        }],
    });
    let index_path = dir.join("index.json");
    std::fs::write(&index_path, index.to_string()).map_err(io(&index_path))?;
    let mut digests: Vec<String> = vec![manifest.digest.to_string()];
    digests.extend(blobs.iter().map(|b| b.digest.to_string()));
    for d in digests {
        let Some(sd) = store::Digest::parse_sha256(&d) else {
            continue;
        };
        let src = store.blob_path(&sd);
        let dst = blob_dir.join(sd.hex());
        if dst.exists() {
            continue;
        }
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).map_err(io(&src))?;
        }
    }
    Ok(())
}
