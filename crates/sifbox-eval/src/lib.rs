//! Agent benchmark tasks run in sifbox sandboxes.
//!
//! A task is a directory in the Harbor/BenchFlow layout ([`task`]): a
//! `task.toml`, an `instruction.md`, an `environment/` build context (or a
//! prebuilt image), a `solution/` and a `tests/` dir. A job runs every task
//! `attempts` times ([`runner`]): each rollout builds (or reuses) the task's
//! image, starts a sandbox with the rollout's own dir at `/logs`, runs the
//! agent, then the verifier, reads the reward and records a
//! [`result::RolloutResult`]; the job ends with a [`result::Summary`].
//!
//! Only the engine's public `Sandbox` API is used, as any library user would.

pub mod cancel;
pub mod error;
pub mod result;
pub mod reward;
pub mod rollout_dir;
pub mod runner;
pub mod steps;
pub mod task;
pub mod template;

pub use error::{EvalError, Result};
