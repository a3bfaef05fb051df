//! Registry images for sifbox: Docker-style references, the registry API
//! (token and basic authentication, manifests, indexes, blobs with
//! resumption and retries), credentials from Docker's and containers'
//! config files, pulls into the image store through its blob cache, and
//! the rule that resolves an IMAGE argument (`resolve`).

pub mod challenge;
pub mod client;
pub mod credentials;
pub mod error;
pub mod progress;
pub mod pull;
pub mod reference;
pub mod resolve;

pub use client::RetryPolicy;
pub use credentials::Credentials;
pub use error::PullError;
pub use progress::{BlobOutcome, Progress, Silent};
pub use pull::{find_pulled, pull, PullOptions, Pulled};
pub use reference::Reference;
pub use resolve::{ImageArg, Located, ResolveError, ResolveOptions, Resolved};
