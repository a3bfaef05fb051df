//! Errors of a pull: each names the reference and, for a registry's
//! refusal, carries the registry's own message.

use sifbox_image::import::ImportError;
use sifbox_image::store::StoreError;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(transparent)]
    Reference(#[from] crate::reference::ReferenceError),
    /// The registry answered with an error status.
    #[error("{reference}: {what}: the registry answered {status}{}", message_suffix(.message))]
    Registry {
        reference: String,
        what: String,
        status: u16,
        message: String,
    },
    /// The registry could not be reached or stopped answering, after
    /// retries.
    #[error("{reference}: {what}: {message} (after {attempts} attempts)")]
    Transport {
        reference: String,
        what: String,
        message: String,
        attempts: u32,
    },
    /// The registry sent something that is not a valid manifest, index or
    /// token, or does not match its digest.
    #[error("{reference}: {message}")]
    Invalid { reference: String, message: String },
    /// Credentials could not be read.
    #[error("{reference}: credentials: {message}")]
    Credentials { reference: String, message: String },
    /// Plain HTTP is not allowed for this registry.
    #[error("{reference}: HTTPS failed ({message}) and plain HTTP is only used for localhost or with --insecure")]
    Insecure { reference: String, message: String },
    #[error("{reference}: {source}")]
    Store {
        reference: String,
        source: StoreError,
    },
    #[error("{reference}: {source}")]
    Import {
        reference: String,
        source: ImportError,
    },
}

fn message_suffix(m: &str) -> String {
    if m.is_empty() {
        String::new()
    } else {
        format!(": {m}")
    }
}

impl PullError {
    /// What the user can do about it.
    #[must_use]
    pub fn fix(&self) -> String {
        match self {
            PullError::Reference(_) => {
                "write it as [REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST]".into()
            }
            PullError::Registry { status: 401, .. } => {
                "log in: pass --creds USER:PASSWORD, or add the registry to ~/.docker/config.json or $REGISTRY_AUTH_FILE".into()
            }
            PullError::Registry { status: 403, .. } => {
                "check that these credentials may pull this repository".into()
            }
            PullError::Registry { status: 404, .. } => {
                "check the repository and tag (or digest) on the registry".into()
            }
            PullError::Registry { status: 429, .. } => {
                "the registry limits requests: wait and pull again, or log in".into()
            }
            PullError::Registry { .. } | PullError::Transport { .. } => {
                "check that the registry is up and reachable (HTTPS_PROXY/NO_PROXY), then pull again: finished blobs are kept and a partial download continues".into()
            }
            PullError::Invalid { .. } => {
                "the registry serves a broken or unsupported image: report it to its owner".into()
            }
            PullError::Credentials { .. } => {
                "fix or remove the credentials file or helper, or pass --creds".into()
            }
            PullError::Insecure { .. } => {
                "pass --insecure to allow plain HTTP (and unverified TLS) for this registry".into()
            }
            PullError::Store { .. } => "check SIFBOX_CACHE (space, permissions)".into(),
            PullError::Import { .. } => {
                "the image's layers could not be unpacked: see the message".into()
            }
        }
    }
}
