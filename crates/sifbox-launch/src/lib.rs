//! From a resolved image and options to a sandbox: the one assembly that
//! `run`, `start` and eval's rollouts share ([`assemble()`]), and what it
//! and builds need beside it that is no build's own: the user's config
//! file, read in one place ([`config`]), the default store ([`store`]),
//! the IMAGE arguments of commands ([`image`]), the host's CA bundle
//! ([`host_ca`]) and the give-back of files that sandboxes wrote as other
//! ids ([`give_back`]).

pub mod assemble;
pub mod config;
pub mod error;
pub mod give_back;
pub mod host_ca;
pub mod image;
pub mod store;

pub use assemble::{
    assemble, current_exe, own_logs, Layer, LimitOptions, LimitsFrom, Logs, Memory, Planned,
    SandboxOptions,
};
pub use config::UserConfig;
pub use error::LaunchError;
