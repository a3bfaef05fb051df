//! Images for sifbox: the SIF container format, squashfs file systems, OCI
//! and Docker image layers, and the content-addressed store that holds them.
//! Nothing here runs processes in sandboxes.

pub mod dedup;
pub mod import;
pub mod layer;
pub mod meta;
pub mod relink;
pub mod setid;
pub mod sif;
pub mod squash;
pub mod store;
