//! Root emulation without subordinate ids: a seccomp filter under which the
//! `chown` and `set*id` families succeed without doing anything, as
//! Charliecloud's `--seccomp` does. With only the caller's own id mapped, a
//! package manager that chowns files to a system user or drops privileges
//! would otherwise fail (EINVAL); under the filter it carries on and every
//! file stays the caller's (root inside).

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// The system calls made to succeed without effect.
const FAKED: &[i64] = &[
    // chown and lchown exist on x86_64 only (aarch64 has fchownat alone).
    #[cfg(target_arch = "x86_64")]
    libc::SYS_chown,
    libc::SYS_fchown,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lchown,
    libc::SYS_fchownat,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
];

/// Installs the filter on the calling thread; children inherit it.
pub fn install() -> std::io::Result<()> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        std::io::Error::other(format!("seccomp on {}: {e}", std::env::consts::ARCH))
    })?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        FAKED.iter().map(|&nr| (nr, Vec::new())).collect();
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(0), arch)
        .map_err(|e| std::io::Error::other(format!("building the seccomp filter: {e}")))?;
    let prog: BpfProgram = filter.try_into().map_err(|e: seccompiler::BackendError| {
        std::io::Error::other(format!("compiling the seccomp filter: {e}"))
    })?;
    seccompiler::apply_filter(&prog)
        .map_err(|e| std::io::Error::other(format!("installing the seccomp filter: {e}")))
}
