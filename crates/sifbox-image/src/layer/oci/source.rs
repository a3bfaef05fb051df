//! The layered image source: a rootfs tarball, an OCI layout or an
//! extracted archive, opened as an [`Image`] whose layer blobs are
//! verified against their digests and applied in order.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use super::archive::{extract_archive, ScratchDir};
use super::model::{
    check_config_desc, check_layer_desc, choose, is_hex64, parse_digest, parse_json,
    reference_matches, ConfigJson, Descriptor, DockerManifest, ImageConfig, IndexOrManifest,
    LayoutJson, Platform, SourceKind, MAX_CONFIG, MAX_MANIFEST,
};
use super::ImportOptions;
use crate::layer::apply::{normalize, Applier};
use crate::layer::compress::{self, Decoder};
use crate::layer::digest::{Digest, HashingReader};
use crate::layer::tarstream::TarReader;
use crate::layer::{ApplyOptions, DeviceNode, Error, LayerReport, Result};

/// Nesting of image indexes followed.
const MAX_INDEX_DEPTH: usize = 4;

#[derive(Debug, Clone)]
enum Location {
    /// A file named by the caller.
    Ambient(PathBuf),
    /// A path inside the source's directory handle.
    InRoot(PathBuf),
}

/// One layer of an image, in application order.
#[derive(Debug, Clone)]
pub struct LayerBlob {
    /// For messages: the digest, or the path in the source.
    pub name: String,
    /// Digest of the blob as stored (compressed), when the source names it.
    pub digest: Option<Digest>,
    /// Digest of the uncompressed tar (the config's `rootfs.diff_ids`).
    pub diff_id: Option<Digest>,
    /// Size of the blob as stored, when the source says.
    pub size: Option<u64>,
    location: Location,
}

/// An image source, opened: its config and its layers.
#[derive(Debug)]
pub struct Image {
    kind: SourceKind,
    source: PathBuf,
    config: ImageConfig,
    platform: Option<Platform>,
    layers: Vec<LayerBlob>,
    manifest_digest: Option<Digest>,
    config_digest: Option<Digest>,
    root: Option<Dir>,
    // Dropped last: removes an extracted archive.
    _scratch: Option<ScratchDir>,
}

/// What [`unpack_image`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// The kind of source.
    pub kind: SourceKind,
    /// The image config (default for a rootfs tarball).
    pub config: ImageConfig,
    /// The platform the image config names, if any.
    pub platform: Option<Platform>,
    /// Digest of the image config, when the source names it: the image's
    /// identity.
    pub config_digest: Option<Digest>,
    /// Layers applied.
    pub layers: usize,
    /// Device nodes still present after all layers (placeholders unless
    /// [`crate::layer::Devices::Create`]).
    pub devices: Vec<DeviceNode>,
}

/// Imports `source` (a rootfs tarball, an OCI layout directory, an
/// oci-archive or a docker-archive, told apart by their content) into
/// `dest` (created if missing): verifies every digest first, then applies
/// the layers in order.
///
/// # Errors
///
/// An [`Error`] naming the source, blob or entry at fault. When a digest
/// does not match, nothing has been written to `dest`; after other errors
/// `dest` may be partly written (never anything outside it).
pub fn unpack_image(source: &Path, dest: &Path, opts: &ImportOptions) -> Result<Unpacked> {
    let image = Image::open(source, opts)?;
    image.verify()?;
    std::fs::create_dir_all(dest).map_err(|e| Error::Io {
        what: format!("creating {}", dest.display()),
        source: e,
    })?;
    let dir = Dir::open_ambient_dir(dest, ambient_authority()).map_err(|e| Error::Io {
        what: format!("opening {}", dest.display()),
        source: e,
    })?;
    let devices = image.apply(&dir, &opts.apply)?;
    Ok(Unpacked {
        kind: image.kind,
        config: image.config.clone(),
        platform: image.platform.clone(),
        config_digest: image.config_digest.clone(),
        layers: image.layers.len(),
        devices,
    })
}

impl Image {
    /// An image of layers in `root` (a layout or an extracted archive),
    /// described by `config`; `digests`: its manifest's and its config's,
    /// where the source names them.
    fn layered(
        kind: SourceKind,
        source: &Path,
        config: &ConfigJson,
        layers: Vec<LayerBlob>,
        digests: (Option<Digest>, Option<Digest>),
        root: Dir,
        scratch: Option<ScratchDir>,
    ) -> Image {
        Image {
            kind,
            source: source.to_path_buf(),
            platform: config.platform(),
            config: config.image_config(),
            layers,
            manifest_digest: digests.0,
            config_digest: digests.1,
            root: Some(root),
            _scratch: scratch,
        }
    }

    /// Opens an image source: a directory with an `oci-layout` file, or a
    /// file that is an oci-archive, a docker-archive or a rootfs tarball
    /// (each plain, gzip or zstd).
    ///
    /// # Errors
    ///
    /// When the source cannot be read, is none of these, has no manifest
    /// for the platform, or a metadata blob does not match its digest.
    pub fn open(source: &Path, opts: &ImportOptions) -> Result<Image> {
        let meta = std::fs::metadata(source).map_err(|e| Error::Io {
            what: format!("image source {}", source.display()),
            source: e,
        })?;
        if meta.is_dir() {
            let root =
                Dir::open_ambient_dir(source, ambient_authority()).map_err(|e| Error::Io {
                    what: format!("opening {}", source.display()),
                    source: e,
                })?;
            if !root.is_file("oci-layout") {
                return Err(Error::Image {
                    what: source.display().to_string(),
                    reason: "a directory without an oci-layout file is not an OCI image layout"
                        .into(),
                });
            }
            return Self::from_oci(SourceKind::OciLayout, source, root, None, opts);
        }
        match extract_archive(source, opts)? {
            Some((kind, scratch)) => {
                let root = scratch.open().map_err(|e| Error::Io {
                    what: format!("opening the extracted {}", source.display()),
                    source: e,
                })?;
                match kind {
                    SourceKind::DockerArchive => Self::from_docker(source, root, scratch, opts),
                    _ => Self::from_oci(kind, source, root, Some(scratch), opts),
                }
            }
            None => Ok(Image {
                kind: SourceKind::RootfsTar,
                source: source.to_path_buf(),
                config: ImageConfig::default(),
                platform: None,
                layers: vec![LayerBlob {
                    name: source.display().to_string(),
                    digest: None,
                    diff_id: None,
                    size: None,
                    location: Location::Ambient(source.to_path_buf()),
                }],
                manifest_digest: None,
                config_digest: None,
                root: None,
                _scratch: None,
            }),
        }
    }

    /// The kind of source.
    #[must_use]
    pub fn kind(&self) -> SourceKind {
        self.kind
    }

    /// The image config.
    #[must_use]
    pub fn config(&self) -> &ImageConfig {
        &self.config
    }

    /// The platform the image config names.
    #[must_use]
    pub fn platform(&self) -> Option<&Platform> {
        self.platform.as_ref()
    }

    /// Digest of the chosen manifest (OCI sources).
    #[must_use]
    pub fn manifest_digest(&self) -> Option<&Digest> {
        self.manifest_digest.as_ref()
    }

    /// Digest of the image config (OCI sources, and docker-archives that
    /// name their config by digest): the image's identity.
    #[must_use]
    pub fn config_digest(&self) -> Option<&Digest> {
        self.config_digest.as_ref()
    }

    /// The layers, bottom first.
    #[must_use]
    pub fn layers(&self) -> &[LayerBlob] {
        &self.layers
    }

    fn what(&self, item: &str) -> String {
        format!("{} {}: {item}", self.kind, self.source.display())
    }

    fn open_layer(&self, layer: &LayerBlob) -> Result<std::fs::File> {
        let opened = match (&layer.location, &self.root) {
            (Location::Ambient(p), _) => std::fs::File::open(p),
            (Location::InRoot(p), Some(root)) => root.open(p).map(cap_std::fs::File::into_std),
            (Location::InRoot(_), None) => Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        opened.map_err(|e| Error::Image {
            what: self.what(&format!("layer {}", layer.name)),
            reason: format!("cannot open it: {e}"),
        })
    }

    /// Checks every layer blob against its digest and size (or, when only
    /// the uncompressed digest is known, against that), reading each once.
    ///
    /// # Errors
    ///
    /// [`Error::DigestMismatch`] naming the first blob that differs.
    pub fn verify(&self) -> Result<()> {
        for layer in &self.layers {
            let (want, compressed) = match (&layer.digest, &layer.diff_id) {
                (Some(d), _) => (d, true),
                (None, Some(d)) => (d, false),
                (None, None) => continue,
            };
            let file = self.open_layer(layer)?;
            let read_err = |e: io::Error| Error::Io {
                what: self.what(&format!("reading layer {}", layer.name)),
                source: e,
            };
            let (got, n) = if compressed {
                let mut r = HashingReader::new(file, Some(want.algorithm()));
                read_all(&mut r).map_err(read_err)?;
                r.finish()
            } else {
                let dec = Decoder::new(file)?;
                let mut r = HashingReader::new(dec, Some(want.algorithm()));
                read_all(&mut r).map_err(read_err)?;
                r.finish()
            };
            check_digest(&layer.name, want, got.as_ref())?;
            if compressed {
                check_size(&layer.name, layer.size, n)?;
            }
        }
        Ok(())
    }

    /// Applies the layers in order onto `dest`, checking digests again as
    /// it reads (call [`Image::verify`] first to be sure nothing is written
    /// from a blob that does not match). Returns the device nodes still
    /// present at the end.
    ///
    /// # Errors
    ///
    /// [`Error::Layer`] wrapping what went wrong in which layer.
    pub fn apply(&self, dest: &Dir, opts: &ApplyOptions) -> Result<Vec<DeviceNode>> {
        let count = self.layers.len();
        let mut devices = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let report = self
                .apply_one(layer, dest, opts)
                .map_err(|e| Error::Layer {
                    index: i + 1,
                    count,
                    name: layer.name.clone(),
                    source: Box::new(e),
                })?;
            devices.extend(report.devices);
        }
        devices.retain(|d| {
            let rel = d.path.trim_start_matches('/');
            dest.symlink_metadata(rel)
                .is_ok_and(|m| !m.is_dir() && !m.file_type().is_symlink())
        });
        Ok(devices)
    }

    fn apply_one(&self, layer: &LayerBlob, dest: &Dir, opts: &ApplyOptions) -> Result<LayerReport> {
        let file = self.open_layer(layer)?;
        let raw = HashingReader::new(file, layer.digest.as_ref().map(Digest::algorithm));
        let mut dec = Decoder::new(raw)?;
        let uncompressed =
            HashingReader::new(&mut dec, layer.diff_id.as_ref().map(Digest::algorithm));
        let mut tar = TarReader::new(uncompressed);
        let mut applier = Applier::new(dest, opts);
        while let Some(entry) = tar.next_entry()? {
            applier.apply(&entry, &mut tar)?;
        }
        let report = applier.finish()?;
        let read_err = |e: io::Error| Error::Io {
            what: self.what(&format!("reading layer {}", layer.name)),
            source: e,
        };
        // Read to the end so that the digests cover the whole blob.
        let mut uncompressed = tar.into_inner();
        read_all(&mut uncompressed).map_err(read_err)?;
        let (_, diff, _) = uncompressed.into_parts();
        let mut rest = dec.into_inner();
        compress::drain(&mut rest).map_err(read_err)?;
        let (_, raw) = rest.into_inner().into_inner();
        let (digest, n) = raw.finish();
        if let Some(want) = &layer.digest {
            check_digest(&layer.name, want, digest.as_ref())?;
            check_size(&layer.name, layer.size, n)?;
        }
        if let Some(want) = &layer.diff_id {
            check_digest(
                &format!("{} (uncompressed)", layer.name),
                want,
                diff.as_ref(),
            )?;
        }
        Ok(report)
    }

    fn from_oci(
        kind: SourceKind,
        source: &Path,
        root: Dir,
        scratch: Option<ScratchDir>,
        opts: &ImportOptions,
    ) -> Result<Image> {
        let what = |item: &str| format!("{kind} {}: {item}", source.display());
        let layout: LayoutJson = read_json(&root, "oci-layout", 64 << 10, &what)?;
        if !layout.image_layout_version.starts_with("1.") {
            return Err(Error::Image {
                what: what("oci-layout"),
                reason: format!(
                    "unsupported imageLayoutVersion {:?}",
                    layout.image_layout_version
                ),
            });
        }
        let mut node: IndexOrManifest = read_json(&root, "index.json", MAX_MANIFEST, &what)?;
        let mut node_name = "index.json".to_string();
        let mut manifest_digest = None;
        let mut depth = 0;
        let manifest = loop {
            node.check_schema(&what(&node_name))?;
            match node.manifests.take() {
                Some(list) => {
                    if depth > MAX_INDEX_DEPTH {
                        return Err(Error::Image {
                            what: what(&node_name),
                            reason: "image indexes nested too deep".into(),
                        });
                    }
                    let chosen = choose(&list, opts, depth == 0, &what(&node_name))?;
                    let bytes = read_blob(&root, chosen, MAX_MANIFEST, &what)?;
                    node_name = format!("manifest {}", chosen.digest);
                    node = parse_json(&bytes, &what(&node_name))?;
                    manifest_digest = Some(parse_digest(&chosen.digest, &what(&node_name))?);
                    depth += 1;
                }
                None if depth == 0 => {
                    return Err(Error::Image {
                        what: what("index.json"),
                        reason: "no `manifests` list".into(),
                    })
                }
                None => break node,
            }
        };
        let config_desc = manifest.config.as_ref().ok_or_else(|| Error::Image {
            what: what(&node_name),
            reason: "no `config` descriptor (not an image manifest)".into(),
        })?;
        check_config_desc(config_desc, &what(&node_name))?;
        let config_bytes = read_blob(&root, config_desc, MAX_CONFIG, &what)?;
        let config_name = format!("config {}", config_desc.digest);
        let config: ConfigJson = parse_json(&config_bytes, &what(&config_name))?;
        let descs = manifest.layers.unwrap_or_default();
        let diff_ids = config.diff_ids(descs.len(), &what(&config_name))?;
        let mut layers = Vec::with_capacity(descs.len());
        for (i, d) in descs.iter().enumerate() {
            check_layer_desc(d, &what(&format!("layer {}", d.digest)))?;
            let digest = parse_digest(&d.digest, &what(&node_name))?;
            let size = u64::try_from(d.size).map_err(|_| Error::Image {
                what: what(&format!("layer {}", d.digest)),
                reason: "negative size".into(),
            })?;
            layers.push(LayerBlob {
                name: digest.to_string(),
                location: Location::InRoot(PathBuf::from(digest.blob_path())),
                digest: Some(digest),
                diff_id: diff_ids.get(i).cloned(),
                size: Some(size),
            });
        }
        let config_digest = parse_digest(&config_desc.digest, &what(&config_name))?;
        let digests = (manifest_digest, Some(config_digest));
        Ok(Image::layered(
            kind, source, &config, layers, digests, root, scratch,
        ))
    }

    fn from_docker(
        source: &Path,
        root: Dir,
        scratch: ScratchDir,
        opts: &ImportOptions,
    ) -> Result<Image> {
        let kind = SourceKind::DockerArchive;
        let what = |item: &str| format!("{kind} {}: {item}", source.display());
        let entries: Vec<DockerManifest> = read_json(&root, "manifest.json", MAX_MANIFEST, &what)?;
        let entry = match (entries.as_slice(), &opts.reference) {
            ([], _) => {
                return Err(Error::Image {
                    what: what("manifest.json"),
                    reason: "no image in it".into(),
                })
            }
            ([one], None) => one,
            (_, Some(r)) => entries
                .iter()
                .find(|e| {
                    e.repo_tags
                        .iter()
                        .flatten()
                        .any(|t| reference_matches(t, r))
                })
                .ok_or_else(|| Error::Image {
                    what: what("manifest.json"),
                    reason: format!("no image tagged {r:?} (tags: {})", docker_tags(&entries)),
                })?,
            (_, None) => {
                return Err(Error::Image {
                    what: what("manifest.json"),
                    reason: format!(
                        "{} images in it: choose one by reference (tags: {})",
                        entries.len(),
                        docker_tags(&entries)
                    ),
                })
            }
        };
        let config_path = safe_rel(&entry.config, &what("manifest.json"))?;
        let config_name = format!("config {}", entry.config);
        let config_bytes = read_capped(&root, &config_path, MAX_CONFIG, &what(&config_name))?;
        if let Some(want) = digest_in_path(&entry.config) {
            let got = Digest::sha256_of(&config_bytes);
            check_digest(&entry.config, &want, Some(&got))?;
        }
        let config: ConfigJson = parse_json(&config_bytes, &what(&config_name))?;
        let diff_ids = config.diff_ids(entry.layers.len(), &what(&config_name))?;
        let mut layers = Vec::with_capacity(entry.layers.len());
        for (i, p) in entry.layers.iter().enumerate() {
            let path = safe_rel(p, &what("manifest.json"))?;
            layers.push(LayerBlob {
                name: p.clone(),
                digest: if p.starts_with("blobs/") {
                    digest_in_path(p)
                } else {
                    None
                },
                diff_id: diff_ids.get(i).cloned(),
                size: None,
                location: Location::InRoot(path),
            });
        }
        let digests = (None, digest_in_path(&entry.config));
        Ok(Image::layered(
            kind,
            source,
            &config,
            layers,
            digests,
            root,
            Some(scratch),
        ))
    }
}

fn read_all<R: Read>(r: &mut R) -> io::Result<u64> {
    let mut buf = vec![0u8; 128 * 1024];
    let mut total = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn check_digest(blob: &str, want: &Digest, got: Option<&Digest>) -> Result<()> {
    match got {
        Some(g) if g == want => Ok(()),
        _ => Err(Error::DigestMismatch {
            blob: blob.to_string(),
            expected: want.to_string(),
            actual: got.map_or_else(|| "nothing".into(), ToString::to_string),
        }),
    }
}

fn check_size(blob: &str, want: Option<u64>, got: u64) -> Result<()> {
    match want {
        Some(w) if w != got => Err(Error::DigestMismatch {
            blob: blob.to_string(),
            expected: format!("{w} bytes"),
            actual: format!("{got} bytes"),
        }),
        _ => Ok(()),
    }
}

/// Reads and parses the JSON document `name` of at most `cap` bytes at the
/// top of `root`; `what` names a file for messages.
fn read_json<T: serde::de::DeserializeOwned>(
    root: &Dir,
    name: &str,
    cap: u64,
    what: &dyn Fn(&str) -> String,
) -> Result<T> {
    let bytes = read_capped(root, Path::new(name), cap, &what(name))?;
    parse_json(&bytes, &what(name))
}

/// Reads a whole file of at most `cap` bytes from `root`.
fn read_capped(root: &Dir, path: &Path, cap: u64, what: &str) -> Result<Vec<u8>> {
    let err = |reason: String| Error::Image {
        what: what.to_string(),
        reason,
    };
    let file = root
        .open(path)
        .map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
    let mut data = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut data)
        .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
    if data.len() as u64 > cap {
        return Err(err(format!(
            "{} is larger than {cap} bytes",
            path.display()
        )));
    }
    Ok(data)
}

/// Reads a metadata blob of an OCI layout and checks its size and digest.
fn read_blob(
    root: &Dir,
    desc: &Descriptor,
    cap: u64,
    what: &dyn Fn(&str) -> String,
) -> Result<Vec<u8>> {
    let name = format!("blob {}", desc.digest);
    let digest = parse_digest(&desc.digest, &what(&name))?;
    let size = u64::try_from(desc.size).map_err(|_| Error::Image {
        what: what(&name),
        reason: "negative size".into(),
    })?;
    if size > cap {
        return Err(Error::Image {
            what: what(&name),
            reason: format!("{size} bytes is more than the {cap} accepted"),
        });
    }
    let data = read_capped(root, Path::new(&digest.blob_path()), cap, &what(&name))?;
    check_size(&desc.digest, Some(size), data.len() as u64)?;
    let got = crate::layer::digest::Hasher::new(digest.algorithm());
    let got = {
        let mut h = got;
        h.update(&data);
        h.finish()
    };
    check_digest(&desc.digest, &digest, Some(&got))?;
    Ok(data)
}

/// A relative path inside an archive, normalised; refuses escapes.
fn safe_rel(p: &str, what: &str) -> Result<PathBuf> {
    let comps = normalize(p.as_bytes()).map_err(|r| Error::Image {
        what: what.to_string(),
        reason: format!("path {p:?}: {r}"),
    })?;
    if comps.is_empty() {
        return Err(Error::Image {
            what: what.to_string(),
            reason: format!("path {p:?} names nothing"),
        });
    }
    let mut out = PathBuf::new();
    for c in comps {
        out.push(String::from_utf8_lossy(c).as_ref());
    }
    Ok(out)
}

/// `blobs/sha256/<hex>` or `<hex>.json` (docker-archive configs).
fn digest_in_path(p: &str) -> Option<Digest> {
    let p = p.trim_start_matches("./");
    let hex = if let Some(rest) = p.strip_prefix("blobs/sha256/") {
        rest
    } else {
        p.strip_suffix(".json")?
    };
    is_hex64(hex.as_bytes())
        .then(|| format!("sha256:{hex}").parse().ok())
        .flatten()
}

fn docker_tags(entries: &[DockerManifest]) -> String {
    let tags: Vec<&str> = entries
        .iter()
        .flat_map(|e| e.repo_tags.iter().flatten())
        .map(String::as_str)
        .collect();
    if tags.is_empty() {
        "none".into()
    } else {
        tags.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_in_paths() {
        let hex = "b".repeat(64);
        assert!(digest_in_path(&format!("blobs/sha256/{hex}")).is_some());
        assert!(digest_in_path(&format!("{hex}.json")).is_some());
        assert!(digest_in_path(&format!("{hex}/layer.tar")).is_none());
        assert!(digest_in_path("x.json").is_none());
    }
}
