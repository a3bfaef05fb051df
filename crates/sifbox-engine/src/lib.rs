//! The sandbox engines of sifbox.
//!
//! The native engine runs a sandbox as a small tree of supervisor processes
//! (see [`supervisor`]) that create user, pid, mount, ipc, uts and optionally
//! network namespaces, assemble an overlay root ([`rootfs`]) and serve exec
//! requests over a Unix socket ([`protocol`]). [`Sandbox`] is the client side.

pub mod aio;
pub mod disk;
pub mod doctor;
pub mod error;
pub mod evidence;
pub mod fakeroot;
pub mod idmap;
pub mod limits;
pub mod protocol;
pub mod request;
pub mod rootfs;
pub mod runtime;
pub mod sandbox;
pub mod seccomp;
pub mod spec;
pub mod supervisor;
pub mod transfer;
pub mod worker;

pub use error::{Error, Result};
pub use request::ExecBuilder;
pub use sandbox::{ExecDefaults, ExecOutput, ExecStatus, Sandbox, StartOptions, Usage};
pub use spec::SandboxSpec;
