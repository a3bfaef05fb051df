//! Registry images for sifbox: Docker-style references, the registry API
//! (token and basic authentication, manifests, indexes, blobs with
//! resumption and retries), credentials from Docker's and containers'
//! config files, and pulls into the image store through its blob cache.

pub mod challenge;
pub mod client;
pub mod credentials;
pub mod error;
pub mod pull;
pub mod reference;

pub use client::RetryPolicy;
pub use credentials::Credentials;
pub use error::PullError;
pub use pull::{find_pulled, pull, BlobOutcome, Progress, PullOptions, Pulled, Silent};
pub use reference::Reference;
