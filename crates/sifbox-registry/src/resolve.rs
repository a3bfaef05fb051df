//! What an IMAGE names, and where its root file system is: the one place
//! that decides it for every command, a Dockerfile's `FROM`, a task's
//! `docker_image` and the Rust API.
//!
//! The rule, per kind of [`ImageArg`]:
//!
//! - `docker://REF` ([`ImageArg::Registry`]): the image pulled for REF,
//!   pulled now if it was not yet;
//! - an existing host path ([`ImageArg::Path`], on the command line only):
//!   a root file system directory used in place, or a file or directory
//!   to import (a SIF, a tarball, an OCI layout or archive, a docker
//!   archive), imported once;
//! - anything else ([`ImageArg::Name`]): a name in the store (`NAME[:TAG]`,
//!   a digest or a digest prefix); where the caller allows it (`FROM`,
//!   `docker_image`), else a registry reference, pulled on first use.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sifbox_image::import::{self, ImportError, SourceKind};
use sifbox_image::meta::{self, ImageMeta};
use sifbox_image::store::{Digest, Store, StoreError};

use crate::{find_pulled, pull, Progress, PullError, PullOptions, Reference};

/// An image as a user names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageArg {
    /// `docker://REF`.
    Registry(Reference),
    /// An existing path on the host.
    Path(PathBuf),
    /// A store name; with `or_pull`, else a registry reference.
    Name { name: String, or_pull: bool },
}

impl ImageArg {
    /// An IMAGE argument of a command: `docker://REF`, an existing path,
    /// or a store name (never pulled by a bare name).
    pub fn from_cli(arg: &str) -> Result<ImageArg, ResolveError> {
        if arg.starts_with("docker://") {
            return Reference::parse(arg)
                .map(ImageArg::Registry)
                .map_err(|e| ResolveError::new(arg, ResolveErrorKind::BadReference(e.reason)));
        }
        if Path::new(arg).exists() {
            return Ok(ImageArg::Path(PathBuf::from(arg)));
        }
        Ok(ImageArg::Name {
            name: arg.to_string(),
            or_pull: false,
        })
    }

    /// The root file system directory this argument names, to be used in
    /// place (no store needed); `None` for anything else.
    pub fn tree(&self) -> Result<Option<PathBuf>, ResolveError> {
        let ImageArg::Path(p) = self else {
            return Ok(None);
        };
        let err = |message: String| {
            ResolveError::new(
                p.display().to_string(),
                ResolveErrorKind::Import(ImportError::Source {
                    source_path: p.clone(),
                    message,
                }),
            )
        };
        match import::classify(p) {
            Ok(SourceKind::RootfsDir) => std::fs::canonicalize(p)
                .map(Some)
                .map_err(|e| err(e.to_string())),
            Ok(_) => Ok(None),
            Err(e) => Err(ResolveError::new(
                p.display().to_string(),
                ResolveErrorKind::Import(e),
            )),
        }
    }

    /// How the argument reads in messages.
    pub fn shown(&self) -> String {
        match self {
            ImageArg::Registry(r) => format!("docker://{r}"),
            ImageArg::Path(p) => p.display().to_string(),
            ImageArg::Name { name, .. } => name.clone(),
        }
    }

    /// A Dockerfile's `FROM` or a task's `docker_image`: a store name, else
    /// a registry reference (`docker://` optional); never a host path.
    pub fn from_reference(arg: &str) -> ImageArg {
        ImageArg::Name {
            name: arg.strip_prefix("docker://").unwrap_or(arg).to_string(),
            or_pull: true,
        }
    }
}

/// Why an image could not be found or made available: `arg` as the user
/// wrote it, and what went wrong.
#[derive(Debug, thiserror::Error)]
#[error("image {arg}: {kind}")]
pub struct ResolveError {
    pub arg: String,
    pub kind: ResolveErrorKind,
}

/// What went wrong while resolving an image.
#[derive(Debug, thiserror::Error)]
pub enum ResolveErrorKind {
    #[error("{0}")]
    BadReference(String),
    #[error("not in the image store ({store}), and not a registry reference: {reason}")]
    NotFound { store: StoreError, reason: String },
    #[error("not in the image store ({store}), and pulling it failed: {pull}")]
    NotLocal {
        store: StoreError,
        pull: Box<PullError>,
    },
    #[error(transparent)]
    Store(StoreError),
    #[error(transparent)]
    Import(ImportError),
    #[error(transparent)]
    Pull(PullError),
}

impl ResolveError {
    fn new(arg: impl Into<String>, kind: ResolveErrorKind) -> ResolveError {
        ResolveError {
            arg: arg.into(),
            kind,
        }
    }

    /// What the user can do about it.
    pub fn fix(&self) -> String {
        match &self.kind {
            ResolveErrorKind::BadReference(_) => {
                "write it as docker://[REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST]".into()
            }
            ResolveErrorKind::NotFound { .. } => {
                "import it with `sifbox image import`, pull it, or name an image from `sifbox image ls`".into()
            }
            ResolveErrorKind::Store(StoreError::NotFound(_) | StoreError::Ambiguous { .. }) => {
                "pass a rootfs directory, a .sif or image archive, or a name from `sifbox image ls`"
                    .into()
            }
            ResolveErrorKind::Store(_) => {
                "check the image store (SIFBOX_CACHE) and its disk; `sifbox gc` removes what is broken".into()
            }
            ResolveErrorKind::Import(e @ ImportError::Damaged { .. }) => e.fix().unwrap_or_default(),
            ResolveErrorKind::Import(_) => {
                "check the file: a .sif, a rootfs tarball, an OCI layout or archive, or a docker archive; an image of the store that fails here is re-imported after `sifbox image rm`".into()
            }
            ResolveErrorKind::Pull(e) => e.fix(),
            ResolveErrorKind::NotLocal { pull, .. } => format!(
                "import it (`sifbox image import`) or name an image from `sifbox image ls`; to pull it: {}",
                pull.fix()
            ),
        }
    }

    /// Whether the error is the user's input (as opposed to the host's: a
    /// full disk, an unreachable registry).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self.kind,
            ResolveErrorKind::BadReference(_)
                | ResolveErrorKind::NotFound { .. }
                | ResolveErrorKind::NotLocal { .. }
                | ResolveErrorKind::Store(StoreError::NotFound(_) | StoreError::Ambiguous { .. })
        )
    }
}

/// Where an image is, once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    /// In the store.
    Stored(Digest),
    /// A root file system directory on the host, used in place.
    Tree(PathBuf),
}

/// How pulls are made while resolving.
#[derive(Clone)]
pub struct ResolveOptions {
    pub pull: PullOptions,
    pub progress: Arc<dyn Progress>,
}

impl std::fmt::Debug for ResolveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolveOptions")
            .field("pull", &self.pull)
            .finish_non_exhaustive()
    }
}

impl Default for ResolveOptions {
    fn default() -> Self {
        ResolveOptions {
            pull: PullOptions::default(),
            progress: Arc::new(crate::Silent),
        }
    }
}

/// Finds `arg` (see the module's rule), pulling or importing it into
/// `store` when it is not there yet.
pub fn locate(
    store: &Store,
    arg: &ImageArg,
    opts: &ResolveOptions,
) -> Result<Located, ResolveError> {
    let pulled = |r: &Reference| -> Result<Located, ResolveError> {
        if let Some(d) = find_pulled(store, r, opts.pull.platform.as_ref()) {
            return Ok(Located::Stored(d));
        }
        pull(store, r, &opts.pull, opts.progress.clone())
            .map(|p| Located::Stored(p.digest))
            .map_err(|e| ResolveError::new(arg.shown(), ResolveErrorKind::Pull(e)))
    };
    match arg {
        ImageArg::Registry(r) => pulled(r),
        ImageArg::Path(p) => {
            if let Some(tree) = arg.tree()? {
                return Ok(Located::Tree(tree));
            }
            import::import(store, p, None)
                .map(|i| Located::Stored(i.digest))
                .map_err(|e| ResolveError::new(arg.shown(), ResolveErrorKind::Import(e)))
        }
        ImageArg::Name { name, or_pull } => match store.resolve(name) {
            Ok(d) => Ok(Located::Stored(d)),
            Err(e @ (StoreError::NotFound(_) | StoreError::Ambiguous { .. })) if *or_pull => {
                match Reference::parse(name) {
                    // Not here, and the registry did not give it either: say
                    // first that it is not a local image.
                    Ok(r) => pulled(&r).map_err(|err| match err.kind {
                        ResolveErrorKind::Pull(pull) => ResolveError::new(
                            name.clone(),
                            ResolveErrorKind::NotLocal {
                                store: e,
                                pull: Box::new(pull),
                            },
                        ),
                        _ => err,
                    }),
                    Err(bad) => Err(ResolveError::new(
                        name.clone(),
                        ResolveErrorKind::NotFound {
                            store: e,
                            reason: bad.reason,
                        },
                    )),
                }
            }
            Err(e) => Err(ResolveError::new(name.clone(), ResolveErrorKind::Store(e))),
        },
    }
}

/// A Dockerfile's `FROM` or a task's `docker_image` ([`ImageArg::from_reference`]):
/// the digest of the stored image, pulled on first use.
pub fn reference(
    store: &Store,
    reference: &str,
    opts: &ResolveOptions,
) -> Result<Digest, ResolveError> {
    match locate(store, &ImageArg::from_reference(reference), opts)? {
        Located::Stored(d) => Ok(d),
        Located::Tree(p) => Err(ResolveError::new(
            reference,
            ResolveErrorKind::BadReference(format!("names the host directory {}", p.display())),
        )),
    }
}

/// An image ready for the engine: its root file system and metadata.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub rootfs: PathBuf,
    pub meta: ImageMeta,
    /// As the caller named it.
    pub reference: String,
    /// `None` for a root file system directory used in place.
    pub digest: Option<Digest>,
    /// The image carries Apptainer env scripts (and no sifbox metadata):
    /// commands must source them.
    pub env_scripts: bool,
    /// A foreign SIF (no sifbox metadata, so no entrypoint or cmd) with an
    /// Apptainer runscript: `run` without `--entrypoint` runs it, as
    /// `apptainer run` does.
    pub runscript: bool,
    /// The store's pin of the image while this (or a clone) lives, for a
    /// sandbox's supervisor to hold too (`StartOptions::holds`); `None` for
    /// a tree used in place, or a shared store's member.
    pub pin: Option<sifbox_image::store::ImagePin>,
}

/// [`locate`]s `arg` and opens it: the root file system (unpacked once) and
/// the metadata. `shown` is how the caller wrote it, for the record.
pub fn resolve(
    store: &Store,
    arg: &ImageArg,
    shown: &str,
    opts: &ResolveOptions,
) -> Result<Resolved, ResolveError> {
    match locate(store, arg, opts)? {
        Located::Tree(rootfs) => Ok(Resolved::in_place(rootfs, shown)),
        Located::Stored(d) => open(store, d, shown),
    }
}

impl Resolved {
    /// A root file system directory used in place (see [`ImageArg::tree`]).
    pub fn in_place(rootfs: PathBuf, shown: &str) -> Resolved {
        Resolved {
            env_scripts: meta::has_env_scripts(&rootfs),
            runscript: false,
            rootfs,
            meta: ImageMeta::default(),
            reference: shown.to_string(),
            digest: None,
            pin: None,
        }
    }
}

/// The root file system and metadata of the stored image `d`.
pub fn open(store: &Store, d: Digest, shown: &str) -> Result<Resolved, ResolveError> {
    let err = |e| ResolveError::new(shown, ResolveErrorKind::Import(e));
    // First: no removal of the image can come between here and the
    // sandbox's own hold on it.
    let pin = store.pin(&d).map_err(|e| err(e.into()))?;
    let meta = import::sifbox_meta(store, &d).map_err(err)?;
    let rootfs = import::rootfs(store, &d).map_err(err)?;
    let foreign = meta.is_none();
    let meta = meta.unwrap_or_default();
    Ok(Resolved {
        env_scripts: foreign && meta::has_env_scripts(&rootfs),
        runscript: foreign && meta::has_runscript(&rootfs),
        rootfs,
        meta,
        reference: shown.to_string(),
        digest: Some(d),
        pin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("store")).expect("store");
        (dir, store)
    }

    #[test]
    fn command_line_arguments_are_registry_references_paths_or_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            ImageArg::from_cli("docker://debian:bookworm"),
            Ok(ImageArg::Registry(_))
        ));
        assert!(matches!(
            ImageArg::from_cli("docker://bad name:tag"),
            Err(ResolveError {
                kind: ResolveErrorKind::BadReference(_),
                ..
            })
        ));
        let p = dir.path().display().to_string();
        assert_eq!(
            ImageArg::from_cli(&p).ok(),
            Some(ImageArg::Path(dir.path().into()))
        );
        assert_eq!(
            ImageArg::from_cli("surely-not-a-file-here:1").ok(),
            Some(ImageArg::Name {
                name: "surely-not-a-file-here:1".into(),
                or_pull: false
            })
        );
        // FROM and docker_image never name a host path.
        assert_eq!(
            ImageArg::from_reference(&p),
            ImageArg::Name {
                name: p.clone(),
                or_pull: true
            }
        );
        assert_eq!(
            ImageArg::from_reference("docker://alpine"),
            ImageArg::Name {
                name: "alpine".into(),
                or_pull: true
            }
        );
    }

    #[test]
    fn a_name_missing_from_the_store_is_bad_input_unless_it_may_be_pulled() {
        let (_d, store) = store();
        let opts = ResolveOptions::default();
        let e = locate(
            &store,
            &ImageArg::from_cli("nothing:here").expect("arg"),
            &opts,
        )
        .expect_err("not in the store");
        assert!(matches!(e.kind, ResolveErrorKind::Store(_)), "{e}");
        assert!(e.is_bad_input());
        // Not a reference either: says both.
        let e = locate(&store, &ImageArg::from_reference("Not A Reference"), &opts)
            .expect_err("neither");
        assert!(matches!(e.kind, ResolveErrorKind::NotFound { .. }), "{e}");
        assert!(e.to_string().contains("not in the image store"), "{e}");
        assert!(e.is_bad_input());
    }

    #[test]
    fn a_missing_local_image_says_so_before_the_registry_does() {
        let (_d, store) = store();
        // Port 1 on the loopback: the pull fails at once.
        let mut opts = ResolveOptions::default();
        opts.pull.retry.attempts = 1;
        let e = locate(
            &store,
            &ImageArg::from_reference("127.0.0.1:1/nothing-local:1"),
            &opts,
        )
        .expect_err("nowhere");
        assert!(matches!(e.kind, ResolveErrorKind::NotLocal { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("image 127.0.0.1:1/nothing-local:1: not in the image store"),
            "{text}"
        );
        assert!(e.fix().starts_with("import it"), "{}", e.fix());
    }

    #[test]
    fn a_rootfs_directory_is_used_in_place() {
        let (d, store) = store();
        let tree = d.path().join("tree");
        std::fs::create_dir_all(tree.join("etc")).expect("mkdir");
        let arg = ImageArg::from_cli(&tree.display().to_string()).expect("arg");
        let r = resolve(&store, &arg, "tree", &ResolveOptions::default()).expect("resolve");
        assert_eq!(r.digest, None);
        assert_eq!(r.rootfs, std::fs::canonicalize(&tree).expect("canonical"));
        assert_eq!(r.reference, "tree");
    }
}
