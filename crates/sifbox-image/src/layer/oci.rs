//! Image sources made of layers: a rootfs tarball, an OCI image layout
//! (directory or `oci-archive` tar) and a `docker save` archive.
//!
//! [`Image::open`] reads the source's metadata (for an archive, after
//! extracting it into a scratch directory that is removed when the
//! [`Image`] is dropped), picks the manifest for the wanted platform, and
//! lists the layers in order. [`Image::verify`] checks every blob against
//! its digest (and, for docker-archives, every layer against the config's
//! `diff_ids`) before anything is written; [`Image::apply`] applies the
//! layers and checks the digests again while reading. [`unpack_image`] does
//! all three.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use rustix::fs::{self as rfs, Mode};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use super::apply::{normalize, remove_tree, Applier};
use super::compress::{self, Decoder};
use super::digest::{Digest, HashingReader};
use super::tarstream::TarReader;
use super::{ApplyOptions, DeviceNode, Error, LayerReport, Result};

/// Largest `index.json`, manifest or `manifest.json` read.
const MAX_MANIFEST: u64 = 4 << 20;
/// Largest image config read.
const MAX_CONFIG: u64 = 16 << 20;
/// Nesting of image indexes followed.
const MAX_INDEX_DEPTH: usize = 4;

/// What an image says about running it (the `config` object of an OCI or
/// Docker image config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageConfig {
    /// `KEY=value` strings, in order.
    pub env: Vec<String>,
    /// Working directory (`WorkingDir`); `None` when unset or empty.
    pub workdir: Option<String>,
    /// User (`User`: a name or id, optionally `:group`); `None` when unset.
    pub user: Option<String>,
    /// `Entrypoint`; `None` when unset (`Some(vec![])` when set empty).
    pub entrypoint: Option<Vec<String>>,
    /// `Cmd`; `None` when unset.
    pub cmd: Option<Vec<String>>,
    /// `Labels`.
    pub labels: BTreeMap<String, String>,
}

impl ImageConfig {
    /// Reads the interesting part of an OCI / Docker image config JSON.
    ///
    /// # Errors
    ///
    /// When the JSON does not parse as an image config.
    pub fn from_oci_json(bytes: &[u8]) -> Result<ImageConfig, serde_json::Error> {
        let c: ConfigJson = serde_json::from_slice(bytes)?;
        Ok(c.image_config())
    }
}

/// An OS / architecture / variant triple, as in OCI image indexes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Platform {
    /// `linux`, ...
    pub os: String,
    /// GOARCH spelling: `amd64`, `arm64`, `arm`, `386`, `ppc64le`, ...
    pub architecture: String,
    /// `v7`, `v8`, ...; `None` matches any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// The platform this process runs on (variant left open).
    #[must_use]
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "powerpc64" => "ppc64",
            "loongarch64" => "loong64",
            "mips64" if cfg!(target_endian = "little") => "mips64le",
            "mips" if cfg!(target_endian = "little") => "mipsle",
            other => other,
        };
        Platform {
            os: std::env::consts::OS.to_string(),
            architecture: architecture.to_string(),
            variant: None,
        }
    }

    fn from_json(p: &PlatformJson) -> Platform {
        Platform {
            os: p.os.clone(),
            architecture: p.architecture.clone(),
            variant: p.variant.clone().filter(|v| !v.is_empty()),
        }
    }

    /// The variant an image without one is taken to have.
    fn default_variant(arch: &str) -> Option<&'static str> {
        match arch {
            "arm64" => Some("v8"),
            "arm" => Some("v7"),
            "amd64" => Some("v1"),
            _ => None,
        }
    }

    fn variant_or_default(&self) -> Option<&str> {
        self.variant
            .as_deref()
            .or_else(|| Self::default_variant(&self.architecture))
    }

    /// Whether an image built for `have` suits a request for `self`.
    fn accepts(&self, have: &Platform) -> bool {
        self.os == have.os
            && self.architecture == have.architecture
            && (self.variant.is_none() || self.variant_or_default() == have.variant_or_default())
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl FromStr for Platform {
    type Err = String;

    /// Parses `os/arch[/variant]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: (*os).to_string(),
                architecture: (*arch).to_string(),
                variant: None,
            }),
            [os, arch, variant] if ok(os) && ok(arch) && ok(variant) => Ok(Platform {
                os: (*os).to_string(),
                architecture: (*arch).to_string(),
                variant: Some((*variant).to_string()),
            }),
            _ => Err(format!(
                "platform {s:?}: expected os/arch[/variant], e.g. linux/arm64"
            )),
        }
    }
}

/// How an import goes.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Platform to pick from a multi-platform index; default: the host's.
    /// An image with a single manifest is taken whatever its platform unless
    /// this is set.
    pub platform: Option<Platform>,
    /// Picks one image in a source holding several: matched against
    /// `org.opencontainers.image.ref.name` / `io.containerd.image.name`
    /// annotations (OCI) or `RepoTags` (docker-archive), exactly or as the
    /// end after a `/`.
    pub reference: Option<String>,
    /// How layers are applied.
    pub apply: ApplyOptions,
    /// Where an archive is extracted while importing; default: the system
    /// temp dir.
    pub tmp_dir: Option<PathBuf>,
}

/// The kind of an image source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// A tarball of a root file system (plain, gzip or zstd): one layer.
    RootfsTar,
    /// A directory holding an OCI image layout.
    OciLayout,
    /// A tar of an OCI image layout.
    OciArchive,
    /// A `docker save` tar (`manifest.json` with `Config`, `Layers`).
    DockerArchive,
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::RootfsTar => "rootfs tarball",
            SourceKind::OciLayout => "OCI image layout",
            SourceKind::OciArchive => "oci-archive",
            SourceKind::DockerArchive => "docker-archive",
        })
    }
}

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
    /// [`super::Devices::Create`]).
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
        let layout = read_capped(
            &root,
            Path::new("oci-layout"),
            64 << 10,
            &what("oci-layout"),
        )?;
        let layout: LayoutJson = parse_json(&layout, &what("oci-layout"))?;
        if !layout.image_layout_version.starts_with("1.") {
            return Err(Error::Image {
                what: what("oci-layout"),
                reason: format!(
                    "unsupported imageLayoutVersion {:?}",
                    layout.image_layout_version
                ),
            });
        }
        let index = read_capped(
            &root,
            Path::new("index.json"),
            MAX_MANIFEST,
            &what("index.json"),
        )?;
        let mut node: IndexOrManifest = parse_json(&index, &what("index.json"))?;
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
        Ok(Image {
            kind,
            source: source.to_path_buf(),
            platform: config.platform(),
            config: config.image_config(),
            layers,
            manifest_digest,
            config_digest: Some(parse_digest(&config_desc.digest, &what(&config_name))?),
            root: Some(root),
            _scratch: scratch,
        })
    }

    fn from_docker(
        source: &Path,
        root: Dir,
        scratch: ScratchDir,
        opts: &ImportOptions,
    ) -> Result<Image> {
        let kind = SourceKind::DockerArchive;
        let what = |item: &str| format!("{kind} {}: {item}", source.display());
        let bytes = read_capped(
            &root,
            Path::new("manifest.json"),
            MAX_MANIFEST,
            &what("manifest.json"),
        )?;
        let entries: Vec<DockerManifest> = parse_json(&bytes, &what("manifest.json"))?;
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
        Ok(Image {
            kind,
            source: source.to_path_buf(),
            platform: config.platform(),
            config: config.image_config(),
            layers,
            manifest_digest: None,
            config_digest: digest_in_path(&entry.config),
            root: Some(root),
            _scratch: Some(scratch),
        })
    }
}

fn check_config_desc(d: &Descriptor, what: &str) -> Result<()> {
    if !d.media_type.is_empty()
        && d.media_type != "application/vnd.oci.image.config.v1+json"
        && d.media_type != "application/vnd.docker.container.image.v1+json"
    {
        return Err(Error::Image {
            what: what.to_string(),
            reason: format!("not a container image (config media type {})", d.media_type),
        });
    }
    Ok(())
}

fn check_layer_desc(d: &Descriptor, what: &str) -> Result<()> {
    if !d.media_type.is_empty() && !d.media_type.contains("tar") {
        return Err(Error::Image {
            what: what.to_string(),
            reason: format!("unsupported layer media type {}", d.media_type),
        });
    }
    if d.media_type.contains("encrypted") {
        return Err(Error::Image {
            what: what.to_string(),
            reason: "encrypted layers are not supported".into(),
        });
    }
    Ok(())
}

/// Largest manifest or index accepted (from a layout or a registry).
pub const MAX_MANIFEST_BYTES: u64 = MAX_MANIFEST;
/// Largest image config accepted.
pub const MAX_CONFIG_BYTES: u64 = MAX_CONFIG;

/// A blob as a manifest or an index names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobDescriptor {
    /// `mediaType` (may be empty).
    pub media_type: String,
    /// Its digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// The platform an index entry is for.
    pub platform: Option<Platform>,
}

/// A manifest or an index (OCI, or Docker's v2 schema 2 and manifest list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manifest {
    /// An image index or manifest list: manifests to choose from.
    Index(Vec<BlobDescriptor>),
    /// An image manifest: the config and the layers, bottom first.
    Image {
        /// The image config blob.
        config: BlobDescriptor,
        /// The layer blobs, bottom first.
        layers: Vec<BlobDescriptor>,
    },
}

impl Manifest {
    /// Parses the bytes of a manifest or index, with the same checks as an
    /// OCI layout import: schema version 2, a container image config, tar
    /// layers that are not encrypted, valid digests and sizes. `what` names
    /// it in errors.
    ///
    /// # Errors
    ///
    /// [`Error::Image`] saying what is wrong.
    pub fn parse(bytes: &[u8], what: &str) -> Result<Manifest> {
        if bytes.len() as u64 > MAX_MANIFEST {
            return Err(Error::Image {
                what: what.to_string(),
                reason: format!("larger than {MAX_MANIFEST} bytes"),
            });
        }
        let node: IndexOrManifest = parse_json(bytes, what)?;
        node.check_schema(what)?;
        if let Some(list) = &node.manifests {
            return list
                .iter()
                .map(|d| BlobDescriptor::from_json(d, what))
                .collect::<Result<Vec<_>>>()
                .map(Manifest::Index);
        }
        let Some(config) = &node.config else {
            return Err(Error::Image {
                what: what.to_string(),
                reason: "neither `manifests` nor `config`: not an image manifest or index".into(),
            });
        };
        check_config_desc(config, what)?;
        let mut layers = Vec::new();
        for d in node.layers.iter().flatten() {
            check_layer_desc(d, &format!("{what}: layer {}", d.digest))?;
            layers.push(BlobDescriptor::from_json(d, what)?);
        }
        Ok(Manifest::Image {
            config: BlobDescriptor::from_json(config, what)?,
            layers,
        })
    }

    /// Picks the manifest for `platform` (the host's when `None`) from the
    /// bytes of an index, as an OCI layout import does (attestations are
    /// skipped; arm64 without a variant is v8).
    ///
    /// # Errors
    ///
    /// [`Error::Image`] listing the platforms available when none suits.
    pub fn select(index: &[u8], platform: Option<&Platform>, what: &str) -> Result<BlobDescriptor> {
        let node: IndexOrManifest = parse_json(index, what)?;
        node.check_schema(what)?;
        let list = node.manifests.as_deref().ok_or_else(|| Error::Image {
            what: what.to_string(),
            reason: "not an index (no `manifests` list)".into(),
        })?;
        let opts = ImportOptions {
            platform: Some(platform.cloned().unwrap_or_else(Platform::host)),
            ..ImportOptions::default()
        };
        let chosen = choose(list, &opts, false, what)?;
        BlobDescriptor::from_json(chosen, what)
    }
}

impl BlobDescriptor {
    fn from_json(d: &Descriptor, what: &str) -> Result<BlobDescriptor> {
        Ok(BlobDescriptor {
            media_type: d.media_type.clone(),
            digest: parse_digest(&d.digest, what)?,
            size: u64::try_from(d.size).map_err(|_| Error::Image {
                what: format!("{what}: blob {}", d.digest),
                reason: "negative size".into(),
            })?,
            platform: d.platform.as_ref().map(Platform::from_json),
        })
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

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Image {
        what: what.to_string(),
        reason: format!("invalid JSON: {e}"),
    })
}

fn parse_digest(s: &str, what: &str) -> Result<Digest> {
    s.parse().map_err(|reason| Error::Image {
        what: what.to_string(),
        reason,
    })
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
    let got = super::digest::Hasher::new(digest.algorithm());
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

fn is_hex64(b: &[u8]) -> bool {
    b.len() == 64
        && b.iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
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

fn reference_matches(name: &str, wanted: &str) -> bool {
    name == wanted || name.ends_with(&format!("/{wanted}"))
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

fn describe(d: &Descriptor) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &d.platform {
        parts.push(Platform::from_json(p).to_string());
    }
    for n in d.names() {
        parts.push(n.to_string());
    }
    if parts.is_empty() {
        d.digest.clone()
    } else {
        parts.join(" ")
    }
}

/// Picks one manifest of an index: by reference (top-level index only),
/// then by platform.
fn choose<'a>(
    list: &'a [Descriptor],
    opts: &ImportOptions,
    top: bool,
    what: &str,
) -> Result<&'a Descriptor> {
    let err = |reason: String| Error::Image {
        what: what.to_string(),
        reason,
    };
    let mut cands: Vec<&Descriptor> = list.iter().filter(|d| !d.is_attestation()).collect();
    let available = |c: &[&Descriptor]| {
        let v: Vec<String> = c.iter().map(|d| describe(d)).collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    if cands.is_empty() {
        return Err(err("no image manifest listed".into()));
    }
    if let (Some(r), true) = (&opts.reference, top) {
        let named: Vec<&Descriptor> = cands
            .iter()
            .copied()
            .filter(|d| d.names().any(|n| reference_matches(n, r)))
            .collect();
        if named.is_empty() {
            return Err(err(format!(
                "no manifest named {r:?} (available: {})",
                available(&cands)
            )));
        }
        cands = named;
    }
    if cands.len() == 1 {
        let only = cands[0];
        if let (Some(want), Some(have)) = (&opts.platform, &only.platform) {
            let have = Platform::from_json(have);
            if !want.accepts(&have) {
                return Err(err(format!(
                    "no manifest for platform {want} (available: {have})"
                )));
            }
        }
        return Ok(only);
    }
    let want = opts.platform.clone().unwrap_or_else(Platform::host);
    let matching: Vec<&Descriptor> = cands
        .iter()
        .copied()
        .filter(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| want.accepts(&Platform::from_json(p)))
        })
        .collect();
    if matching.is_empty() {
        let any_platform = cands.iter().any(|d| d.platform.is_some());
        return Err(err(if any_platform {
            format!(
                "no manifest for platform {want} (available: {})",
                available(&cands)
            )
        } else {
            format!(
                "{} manifests and none says its platform: choose one by reference (available: {})",
                cands.len(),
                available(&cands)
            )
        }));
    }
    // Prefer the variant an image without one is taken to have (arm64/v8).
    let preferred = matching.iter().copied().find(|d| {
        d.platform.as_ref().is_some_and(|p| {
            let p = Platform::from_json(p);
            p.variant_or_default() == want.variant_or_default()
        })
    });
    Ok(preferred.unwrap_or(matching[0]))
}

/// Extracts an oci-archive or docker-archive into a scratch directory.
/// `None` when the file is a rootfs tarball instead: its first entries have
/// names no archive has.
fn extract_archive(
    source: &Path,
    opts: &ImportOptions,
) -> Result<Option<(SourceKind, ScratchDir)>> {
    let what = || format!("image source {}", source.display());
    let file = std::fs::File::open(source).map_err(|e| Error::Io {
        what: what(),
        source: e,
    })?;
    let wrap = |e: Error| match e {
        Error::Malformed { offset, reason } => Error::Image {
            what: what(),
            reason: format!(
                "not an image archive or rootfs tarball: malformed tar at byte {offset}: {reason}"
            ),
        },
        other => other,
    };
    let mut dec = Decoder::new(file).map_err(wrap)?;
    let mut tar = TarReader::new(&mut dec);
    let Some(mut entry) = tar.next_entry().map_err(wrap)? else {
        return Ok(None);
    };
    if !archive_name(&entry.path) {
        return Ok(None);
    }
    let base = opts.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = ScratchDir::new(&base).map_err(|e| Error::Io {
        what: format!("creating a scratch directory in {}", base.display()),
        source: e,
    })?;
    let root = scratch.open().map_err(|e| Error::Io {
        what: format!("opening a scratch directory in {}", base.display()),
        source: e,
    })?;
    let in_archive = |e: Error| Error::Archive {
        archive: source.display().to_string(),
        source: Box::new(e),
    };
    let mut applier = Applier::new(&root, &ApplyOptions::default());
    loop {
        if !archive_name(&entry.path) {
            return Ok(None);
        }
        applier.apply(&entry, &mut tar).map_err(in_archive)?;
        match tar.next_entry().map_err(in_archive)? {
            Some(next) => entry = next,
            None => break,
        }
    }
    applier.finish().map_err(in_archive)?;
    let kind = if root.is_file("oci-layout") {
        SourceKind::OciArchive
    } else if root.is_file("manifest.json") {
        SourceKind::DockerArchive
    } else {
        return Ok(None);
    };
    drop(root);
    Ok(Some((kind, scratch)))
}

/// Whether a tar entry's name can be part of an oci-archive or a
/// docker-archive.
fn archive_name(raw: &[u8]) -> bool {
    let Ok(comps) = normalize(raw) else {
        return false;
    };
    let Some(first) = comps.first() else {
        return true;
    };
    matches!(
        *first,
        b"oci-layout" | b"index.json" | b"manifest.json" | b"repositories" | b"blobs"
    ) || is_hex64(first)
        || first.strip_suffix(b".json").is_some_and(is_hex64)
        || first.strip_suffix(b".tar").is_some_and(is_hex64)
}

/// A private directory removed (with all it holds) when dropped.
#[derive(Debug)]
struct ScratchDir {
    parent: Dir,
    name: String,
}

impl ScratchDir {
    fn new(base: &Path) -> io::Result<ScratchDir> {
        let parent = Dir::open_ambient_dir(base, ambient_authority())?;
        for _ in 0..16 {
            let mut r = [0u8; 8];
            rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty())?;
            let name = format!(".sifbox-import-{}", hex::encode(r));
            match rfs::mkdirat(&parent, name.as_str(), Mode::RWXU) {
                Ok(()) => return Ok(ScratchDir { parent, name }),
                Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free scratch directory name",
        ))
    }

    fn open(&self) -> io::Result<Dir> {
        self.parent.open_dir(&self.name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.parent, self.name.as_bytes()) {
            tracing::warn!(name = %self.name, error = %e, "cannot remove a scratch directory");
        }
    }
}

#[derive(Debug, Deserialize)]
struct LayoutJson {
    #[serde(rename = "imageLayoutVersion")]
    image_layout_version: String,
}

#[derive(Debug, Deserialize)]
struct PlatformJson {
    architecture: String,
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    platform: Option<PlatformJson>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

impl Descriptor {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.annotations.iter().flat_map(|a| {
            [
                "org.opencontainers.image.ref.name",
                "io.containerd.image.name",
            ]
            .into_iter()
            .filter_map(|k| a.get(k).map(String::as_str))
        })
    }

    fn is_attestation(&self) -> bool {
        let annotated = self.annotations.as_ref().is_some_and(|a| {
            a.get("vnd.docker.reference.type")
                .is_some_and(|t| t == "attestation-manifest")
        });
        annotated || self.platform.as_ref().is_some_and(|p| p.os == "unknown")
    }
}

#[derive(Debug, Deserialize)]
struct IndexOrManifest {
    #[serde(rename = "schemaVersion", default)]
    schema_version: Option<u32>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

impl IndexOrManifest {
    fn check_schema(&self, what: &str) -> Result<()> {
        match self.schema_version {
            Some(2) | None => Ok(()),
            Some(v) => Err(Error::Image {
                what: what.to_string(),
                reason: format!("unsupported schemaVersion {v}"),
            }),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct ContainerConfigJson {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "User", default)]
    user: Option<String>,
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
struct RootfsJson {
    #[serde(default)]
    diff_ids: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ConfigJson {
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    config: Option<ContainerConfigJson>,
    #[serde(default)]
    rootfs: Option<RootfsJson>,
}

impl ConfigJson {
    fn image_config(&self) -> ImageConfig {
        let Some(c) = &self.config else {
            return ImageConfig::default();
        };
        let nonempty = |s: &Option<String>| s.clone().filter(|v| !v.is_empty());
        ImageConfig {
            env: c.env.clone().unwrap_or_default(),
            workdir: nonempty(&c.working_dir),
            user: nonempty(&c.user),
            entrypoint: c.entrypoint.clone(),
            cmd: c.cmd.clone(),
            labels: c.labels.clone().unwrap_or_default(),
        }
    }

    fn platform(&self) -> Option<Platform> {
        match (&self.os, &self.architecture) {
            (Some(os), Some(arch)) if !os.is_empty() && !arch.is_empty() => Some(Platform {
                os: os.clone(),
                architecture: arch.clone(),
                variant: self.variant.clone().filter(|v| !v.is_empty()),
            }),
            _ => None,
        }
    }

    /// The `rootfs.diff_ids`, which must be one per layer when present.
    fn diff_ids(&self, layers: usize, what: &str) -> Result<Vec<Digest>> {
        let ids = self
            .rootfs
            .as_ref()
            .map(|r| r.diff_ids.as_slice())
            .unwrap_or_default();
        if ids.is_empty() && layers > 0 && self.rootfs.is_none() {
            return Ok(Vec::new());
        }
        if ids.len() != layers {
            return Err(Error::Image {
                what: what.to_string(),
                reason: format!(
                    "rootfs.diff_ids lists {} layers but the manifest has {layers}",
                    ids.len()
                ),
            });
        }
        ids.iter().map(|s| parse_digest(s, what)).collect()
    }
}

#[derive(Debug, Deserialize)]
struct DockerManifest {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms() {
        let p: Platform = "linux/arm64/v8".parse().expect("parses");
        assert_eq!(p.to_string(), "linux/arm64/v8");
        assert!("linux".parse::<Platform>().is_err());
        assert!("linux//x".parse::<Platform>().is_err());
        assert!("a/b/c/d".parse::<Platform>().is_err());
        let arm64: Platform = "linux/arm64".parse().expect("parses");
        let v8 = Platform {
            variant: Some("v8".into()),
            ..arm64.clone()
        };
        assert!(arm64.accepts(&v8));
        assert!(v8.accepts(&arm64));
        let arm7: Platform = "linux/arm/v7".parse().expect("parses");
        let arm6: Platform = "linux/arm/v6".parse().expect("parses");
        assert!(!arm7.accepts(&arm6));
        assert!(!arm64.accepts(&"linux/amd64".parse().expect("parses")));
        assert_eq!(Platform::host().os, std::env::consts::OS);
    }

    #[test]
    fn archive_names() {
        let hex = "a".repeat(64);
        for ok in [
            "oci-layout".to_string(),
            "./index.json".into(),
            "blobs/sha256/x".into(),
            format!("{hex}/layer.tar"),
            format!("{hex}.json"),
            format!("{hex}.tar"),
            "./".into(),
        ] {
            assert!(archive_name(ok.as_bytes()), "{ok}");
        }
        for no in ["bin/sh", "./etc/", "../x", "/abs", "manifest.jsonx"] {
            assert!(!archive_name(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn digests_in_paths() {
        let hex = "b".repeat(64);
        assert!(digest_in_path(&format!("blobs/sha256/{hex}")).is_some());
        assert!(digest_in_path(&format!("{hex}.json")).is_some());
        assert!(digest_in_path(&format!("{hex}/layer.tar")).is_none());
        assert!(digest_in_path("x.json").is_none());
    }

    #[test]
    fn registry_manifests() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json",
              "manifests":[
                {{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":"{}","size":10,
                  "platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
                {{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":"{}","size":11,
                  "platform":{{"architecture":"amd64","os":"linux"}}}},
                {{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":12,
                  "platform":{{"architecture":"unknown","os":"unknown"}}}}]}}"#,
            d('a'),
            d('b'),
            d('c')
        );
        match Manifest::parse(index.as_bytes(), "index").expect("parses") {
            Manifest::Index(list) => assert_eq!(list.len(), 3),
            other => panic!("not an index: {other:?}"),
        }
        let arm: Platform = "linux/arm64".parse().expect("platform");
        let amd: Platform = "linux/amd64".parse().expect("platform");
        let pick = |p: &Platform| {
            Manifest::select(index.as_bytes(), Some(p), "index")
                .expect("selects")
                .digest
                .to_string()
        };
        assert_eq!(pick(&arm), d('a'));
        assert_eq!(pick(&amd), d('b'));
        let e = Manifest::select(
            index.as_bytes(),
            Some(&"linux/s390x".parse().expect("p")),
            "index",
        )
        .expect_err("no s390x");
        assert!(e.to_string().contains("linux/arm64/v8"), "{e}");
        let manifest = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"{}","size":5}},
               "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"{}","size":7}}]}}"#,
            d('e'),
            d('f')
        );
        match Manifest::parse(manifest.as_bytes(), "m").expect("parses") {
            Manifest::Image { config, layers } => {
                assert_eq!(config.size, 5);
                assert_eq!(layers.len(), 1);
                assert_eq!(layers[0].digest.to_string(), d('f'));
            }
            other => panic!("not a manifest: {other:?}"),
        }
        for bad in [
            r#"{"schemaVersion":1,"fsLayers":[]}"#.to_string(),
            r#"{"schemaVersion":2}"#.to_string(),
            r#"[1,2]"#.to_string(),
            manifest.replace("tar+zstd", "tar+encrypted"),
            manifest.replace("container.image.v1+json", "helm.chart.content.v1.tar+gzip"),
            manifest.replace("\"size\":7", "\"size\":-7"),
        ] {
            assert!(Manifest::parse(bad.as_bytes(), "m").is_err(), "{bad}");
        }
    }

    #[test]
    fn config_json() {
        let c = ImageConfig::from_oci_json(
            br#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"WorkingDir":"",
                "User":"1000:1000","Entrypoint":null,"Cmd":["sh"],"Labels":{"k":"v"}},
                "rootfs":{"type":"layers","diff_ids":[]}}"#,
        )
        .expect("parses");
        assert_eq!(c.env, ["A=1"]);
        assert_eq!(c.workdir, None);
        assert_eq!(c.user.as_deref(), Some("1000:1000"));
        assert_eq!(c.entrypoint, None);
        assert_eq!(c.cmd, Some(vec!["sh".to_string()]));
        assert_eq!(c.labels.get("k").map(String::as_str), Some("v"));
        assert_eq!(
            ImageConfig::from_oci_json(b"{}").expect("empty"),
            ImageConfig::default()
        );
        let json = serde_json::to_string(&c).expect("serializes");
        let back: ImageConfig = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, c);
    }
}
