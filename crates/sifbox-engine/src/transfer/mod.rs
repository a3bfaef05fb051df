//! Copying files and directories into and out of a sandbox (`sifbox cp`).
//!
//! Both directions move a tar stream through a pipe, so nothing is held
//! whole in memory. Archives keep symlinks as links (never followed),
//! modes and mtimes. The sandbox side runs inside the sandbox; the host side
//! runs as the caller, and there both ends are hostile: a sandbox writes the
//! stream of a download, and it can change a host directory bound into it
//! while an upload reads that directory. So no path is ever resolved twice
//! and nothing below the path the user named is followed:
//!
//! - [`write_tar`] opens the source once and walks below it through
//!   directory fds: each name is opened with `O_PATH | O_NOFOLLOW`, its header
//!   comes from `fstat` of that fd, a link's target from `readlinkat` on it,
//!   and data from a reopen (`O_NOFOLLOW`) that must be the same inode. A name
//!   that changes under the walk is stored as what was opened, or left out
//!   with a warning.
//! - Unpacking ([`unpack_tar`], [`unpack_to_host`], [`extract_tar`]) reaches
//!   every parent from the destination's fd one component at a time with
//!   `openat(O_NOFOLLOW | O_DIRECTORY)`, so no `..`, absolute name or symlink
//!   (one placed earlier in the stream or already in the destination) leads
//!   outside it; entries are created with `*at()` calls and their owners,
//!   modes and times set on the fd of what was created. Directory modes are
//!   applied at the end on a reopened fd that is checked to be a directory. A
//!   path that the stream writes twice with different types, and a hard link
//!   to anything but a regular file the stream wrote before, are refused.
//!   On the host, setuid and setgid bits are dropped unless asked for.
//! - Files with holes travel as sparse entries and land with their holes
//!   ([`sparse`]); what an unpacking writes is counted against its
//!   [`Limits`] as it goes, and an unpacking that fails removes what it made.
//!
//! The module: `write` (archiving a host tree), `unpack` (unpacking
//! a stream into one), `owners` (`/` as a tar, and giving a bound tree
//! back to the caller); every step on a host tree goes through
//! [`sifbox_sys::beneath`], the one fd-relative file layer.

mod owners;
pub mod sparse;
mod unpack;
mod write;

pub use owners::{anything_not_owned_by, give_back, mirror_owners, write_root_tar};
pub use sparse::{LimitExceeded, Limits};
pub use unpack::{
    extract_into, extract_tar, retar, retar_limited, unpack_tar, unpack_to_host,
    unpack_to_host_limited,
};
pub use write::{write_tar, write_tar_following, write_tar_marking};

/// What becomes of the setuid and setgid bits of unpacked entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetId {
    /// Kept: inside a sandbox, where a setuid file gives nothing its root
    /// does not have already, and for copies the caller keeps private.
    Keep,
    /// Dropped: downloads to the host, where a setuid file that a sandbox
    /// planted would run with the rights of whoever owns it (root, when
    /// root downloads).
    Strip,
}

#[cfg(test)]
mod tests;
