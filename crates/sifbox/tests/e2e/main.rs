//! The end-to-end tests of sifbox, as one test binary (`e2e`) with a module
//! per suite, as ripgrep's tests are organised: one link step instead of
//! eight, and one copy of the shared helpers (`harness`).
//!
//! They drive the real `sifbox` binary (`$SIFBOX_BIN`, else the one Cargo
//! built) against the busybox test rootfs (`$SIFBOX_TEST_ROOTFS`, else
//! `target/test-rootfs`). scripts/test.sh runs them as root and again as
//! the unprivileged user sbtest. Run one suite with a filter on its module,
//! e.g. `cargo nextest run -p sifbox --test e2e -E 'test(/^sandboxes::/)'`
//! or `cargo test -p sifbox --test e2e sandboxes::`.
//!
//! Suites:
//!  - `cli`: `sifbox run` (identity, namespaces, env, mounts, binds, teardown...)
//!  - `compat`: real programs (TLS clients, pip, Node, Go, Rust, a JVM, gdb...) under the seccomp policy
//!  - `sandboxes`: long-lived sandboxes (start, exec, cp, ps, stop, gc, evidence)
//!  - `images`: importing, the store, exporting, interop with Apptainer's tools
//!  - `registry`: pulls from a real registry
//!  - `build`: `sifbox build`
//!  - `eval`: `sifbox eval`
//!  - `limits`: resource limits
//!  - `hostile`: what a hostile command inside would try against the host

mod harness;

mod build;
mod cli;
mod compat;
mod eval;
mod hostile;
mod images;
mod limits;
mod registry;
mod sandboxes;
