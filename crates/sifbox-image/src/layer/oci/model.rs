//! The OCI and Docker documents an image is described by: index, manifest,
//! image config and the archive/layout metadata files, as parsed (the serde
//! wire types) and as exposed (platforms, descriptors, manifests, config).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ImportOptions;
use crate::layer::digest::Digest;
use crate::layer::{Error, Result};

/// Largest `index.json`, manifest or `manifest.json` read.
pub(super) const MAX_MANIFEST: u64 = 4 << 20;
/// Largest image config read.
pub(super) const MAX_CONFIG: u64 = 16 << 20;

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

pub(super) fn check_config_desc(d: &Descriptor, what: &str) -> Result<()> {
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

pub(super) fn check_layer_desc(d: &Descriptor, what: &str) -> Result<()> {
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

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Image {
        what: what.to_string(),
        reason: format!("invalid JSON: {e}"),
    })
}

pub(super) fn parse_digest(s: &str, what: &str) -> Result<Digest> {
    s.parse().map_err(|reason| Error::Image {
        what: what.to_string(),
        reason,
    })
}

pub(super) fn reference_matches(name: &str, wanted: &str) -> bool {
    name == wanted || name.ends_with(&format!("/{wanted}"))
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
pub(super) fn choose<'a>(
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

#[derive(Debug, Deserialize)]
pub(super) struct LayoutJson {
    #[serde(rename = "imageLayoutVersion")]
    pub(super) image_layout_version: String,
}

#[derive(Debug, Deserialize)]
struct PlatformJson {
    architecture: String,
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    pub(super) digest: String,
    pub(super) size: i64,
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
pub(super) struct IndexOrManifest {
    #[serde(rename = "schemaVersion", default)]
    schema_version: Option<u32>,
    #[serde(default)]
    pub(super) manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    pub(super) config: Option<Descriptor>,
    #[serde(default)]
    pub(super) layers: Option<Vec<Descriptor>>,
}

impl IndexOrManifest {
    pub(super) fn check_schema(&self, what: &str) -> Result<()> {
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
pub(super) struct ConfigJson {
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
    pub(super) fn image_config(&self) -> ImageConfig {
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

    pub(super) fn platform(&self) -> Option<Platform> {
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
    pub(super) fn diff_ids(&self, layers: usize, what: &str) -> Result<Vec<Digest>> {
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
pub(super) struct DockerManifest {
    #[serde(rename = "Config")]
    pub(super) config: String,
    #[serde(rename = "RepoTags", default)]
    pub(super) repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    pub(super) layers: Vec<String>,
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

/// Whether `b` is 64 lowercase hex digits (a sha256 digest's hex).
pub(super) fn is_hex64(b: &[u8]) -> bool {
    b.len() == 64
        && b.iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
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
