//! The sandbox engines of sifbox.
//!
//! The native engine runs a sandbox as a small tree of supervisor processes
//! (see [`supervisor`]) that create user, pid, mount, ipc, uts and optionally
//! network namespaces, assemble an overlay root ([`rootfs`]) and serve exec
//! requests over a Unix socket ([`protocol`]). [`Sandbox`] is the client side.

pub mod aio;
pub mod denials;
pub mod disk;
pub mod doctor;
pub mod error;
pub mod evidence;
pub mod fakeroot;
pub mod idmap;
pub mod layer_copy;
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

pub use error::{
    AioError, DiskError, Error, EvidenceError, Result, RuntimeError, SandboxError, SpecError,
    SupervisorError,
};

/// `bytes` random bytes as hex digits, for names nothing else can have
/// made ready (sandbox, exec and cgroup names, temp files); from the
/// kernel's random source, else the clock (a clash is then retried by
/// whoever makes the name with `O_EXCL` or `mkdir`).
pub fn random_id(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
            .to_le_bytes();
        for (i, x) in b.iter_mut().enumerate() {
            *x = n[i % n.len()];
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
pub use request::ExecBuilder;
pub use sandbox::{ExecDefaults, ExecOutput, ExecStatus, Sandbox, StartOptions, Stopping, Usage};
pub use spec::SandboxSpec;

#[cfg(test)]
mod tests {
    #[test]
    fn random_ids_are_hex_of_the_length_asked_and_differ() {
        let a = super::random_id(8);
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, super::random_id(8));
        assert_eq!(super::random_id(3).len(), 6);
    }
}
