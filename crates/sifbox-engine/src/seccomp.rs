//! The default seccomp policy for commands in a sandbox.
//!
//! The policy is reviewed data, `seccomp/policy.toml` (every rule with its
//! reason), compiled by `build.rs` for the target's architecture into BPF
//! programs that this module includes: installing it hands ready programs to
//! the kernel, nothing is parsed or compiled at sandbox start.
//!
//! [`install`] installs one filter on the calling thread (children inherit
//! it). Its answers, in the policy's terms:
//! - allowed calls pass, some only with checked arguments (clone and
//!   unshare without namespace flags, ioctl without TIOCSTI and TIOCLINUX,
//!   socket without AF_VSOCK, personality);
//! - the ENOSYS set (clone3, io_uring, listmount/statmount) and every call
//!   numbered above all the policy names (calls newer than the policy) get
//!   ENOSYS, so that libraries fall back to older calls;
//! - every other call fails with EPERM;
//! - a call through a foreign ABI (32-bit x86 on x86_64, arm32 on aarch64)
//!   kills the process: 32-bit programs need `--seccomp unconfined`.
//!
//! With nested namespaces allowed ([`install`]`(true)`), the `[userns]` set
//! is allowed too and clone and unshare lose their checks; clone3 is then
//! allowed.
//!
//! The program is a binary search over ranges of system call numbers that
//! get the same answer, with seccompiler's code for the argument checks
//! (see `seccomp/compile.rs`). seccompiler's own output for the same policy,
//! a linear chain (an allow-list filter, an ENOSYS filter and the range
//! filter for newer calls, stacked), is what the tests compare it with for
//! every number and many arguments; it is ten times longer and takes the
//! kernel ten times as long to install (0.7 ms against 0.05 ms here).
//!
//! The fakeroot filter ([`crate::fakeroot`]), when used, is installed
//! before this one and fakes chown and set*id with errno 0; the kernel keeps
//! the most restrictive answer of all filters, and errno 0 wins over allow,
//! so the policy allows every call fakeroot fakes.

use sifbox_sys::SockFilter;

/// One BPF instruction of the generated programs.
const fn f(code: u16, jt: u8, jf: u8, k: u32) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

// The generated file: the programs POLICY and POLICY_USERNS, NEWER_FROM,
// the name tables with their reasons (ALLOW, CONDITIONAL, ENOSYS_SET, USERNS,
// DENY) and NUMBERS.
include!(concat!(env!("OUT_DIR"), "/seccomp_policy.rs"));

/// The program [`install`] installs.
pub fn program(allow_userns: bool) -> &'static [SockFilter] {
    if allow_userns {
        POLICY_USERNS
    } else {
        POLICY
    }
}

/// Installs the default policy on the calling thread; every process it
/// starts afterwards inherits it. `allow_userns` adds the nested-namespace
/// set (unshare and clone with namespace flags, clone3, setns, mount and the
/// mount API, pivot_root).
///
/// The caller must be single-threaded or accept that only this thread is
/// filtered, and must either have CAP_SYS_ADMIN in its user namespace (as
/// root of a sandbox's user namespace does) or have set no_new_privs; the
/// policy does not set no_new_privs, so setuid programs inside keep working.
/// Everything the caller does after this call is filtered too.
pub fn install(allow_userns: bool) -> std::io::Result<()> {
    if !SUPPORTED {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "sifbox has no default seccomp policy for {}; run unconfined (`--seccomp unconfined`)",
                std::env::consts::ARCH
            ),
        ));
    }
    sifbox_sys::install_seccomp_filter(program(allow_userns)).map_err(|e| {
        let kind = match &e {
            sifbox_sys::Error::Seccomp(io) => io.kind(),
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, format!("installing the default seccomp policy: {e}"))
    })?;
    Ok(())
}

/// The program [`install_reporting`] installs: [`program`] with every EPERM
/// answer made a user notification.
pub fn notify_program(allow_userns: bool) -> &'static [SockFilter] {
    if allow_userns {
        POLICY_USERNS_NOTIFY
    } else {
        POLICY_NOTIFY
    }
}

/// Installs the default policy as [`install`] does, but with a listener
/// that hears every denied call: the returned descriptor must be served
/// (`crate::denials::serve`) or every denied call waits for ever. Calls the
/// policy allows never reach it. `Ok(None)`: this process's filter chain
/// already has a listener (a sifbox inside a sandbox); the plain policy is
/// installed instead and denials stay silent.
pub fn install_reporting(allow_userns: bool) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    if !SUPPORTED {
        install(allow_userns)?;
        return Ok(None);
    }
    match sifbox_sys::seccomp_notify::install_filter_with_listener(notify_program(allow_userns)) {
        Ok(Some(fd)) => Ok(Some(fd)),
        Ok(None) => install(allow_userns).map(|()| None),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("installing the default seccomp policy with a listener: {e}"),
        )),
    }
}

/// The name of system call `nr` on this architecture, if the policy names
/// it (every call it allows or names as denied).
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    NUMBERS
        .iter()
        .find(|(_, n)| *n == nr)
        .map(|(name, _)| *name)
}

/// The system calls allowed (some with argument checks) with and without
/// nested namespaces.
pub fn allowed(allow_userns: bool) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = ALLOW
        .iter()
        .chain(CONDITIONAL)
        .map(|(name, _)| *name)
        .collect();
    if allow_userns {
        out.extend(USERNS.iter().map(|(name, _)| *name));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The calls allowed only when their arguments pass a check, with the
/// reason; with nested namespaces clone and unshare lose their checks.
pub fn conditional() -> Vec<(&'static str, &'static str)> {
    CONDITIONAL.to_vec()
}

/// The calls answered ENOSYS, with the reason.
pub fn enosys(allow_userns: bool) -> Vec<(&'static str, &'static str)> {
    ENOSYS_SET
        .iter()
        .filter(|(name, _)| !(allow_userns && USERNS.iter().any(|(u, _)| u == name)))
        .copied()
        .collect()
}

/// The calls that only nested namespaces allow, with the reason.
pub fn userns() -> Vec<(&'static str, &'static str)> {
    USERNS.to_vec()
}

/// The notable denied calls (EPERM) with the reason each is denied; any call
/// not allowed is denied, these are the ones worth naming.
pub fn denied() -> Vec<(&'static str, &'static str)> {
    DENY.to_vec()
}

/// The number of a system call the policy names, on this architecture.
pub fn syscall_number(name: &str) -> Option<i64> {
    NUMBERS.iter().find(|(n, _)| *n == name).map(|(_, nr)| *nr)
}

/// System calls numbered from here on are newer than the policy and answered
/// ENOSYS.
pub fn newer_from() -> u32 {
    NEWER_FROM
}

/// The policy compiler of build.rs, for the tests to compile the policy for
/// every architecture.
#[cfg(test)]
#[path = "../seccomp/compile.rs"]
mod compile;

#[cfg(test)]
mod tests {
    //! The policy file's rules, and the compiled programs run in a small BPF
    //! interpreter for every architecture. The kernel's own answers are
    //! checked by tests/seccomp.rs.

    use super::compile;
    use super::*;
    use seccompiler::TargetArch;
    use std::collections::BTreeSet;

    const POLICY_TOML: &str = include_str!("../seccomp/policy.toml");
    /// What Docker's default profile allows (facts, one name a line).
    const DOCKER_DEFAULT: &str = include_str!("../seccomp/docker-default.txt");

    /// What the issue (12, item 6) says must never be allowed by default,
    /// on every architecture; x86_64 adds its own below.
    const MUST_DENY: &[&str] = &[
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "userfaultfd",
        "perf_event_open",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "open_by_handle_at",
        "acct",
        "swapon",
        "swapoff",
        "reboot",
        "settimeofday",
        "clock_settime",
        "lookup_dcookie",
        "quotactl",
        "quotactl_fd",
        "syslog",
        "clone3",
        "setns",
        "mount",
        "umount2",
        "pivot_root",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "fanotify_init",
        "nfsservctl",
        "vhangup",
    ];
    const MUST_DENY_X86_64: &[&str] = &["iopl", "ioperm", "uselib", "modify_ldt", "_sysctl"];

    fn policy() -> compile::Policy {
        compile::parse(POLICY_TOML).expect("policy.toml parses")
    }

    fn programs(arch: TargetArch) -> compile::Programs {
        compile::compile(&policy(), arch).expect("policy compiles")
    }

    /// `struct seccomp_data` as the interpreter reads it.
    struct Data {
        nr: u32,
        arch: u32,
        args: [u64; 6],
    }

    impl Data {
        fn word(&self, offset: u32) -> u32 {
            match offset {
                0 => self.nr,
                4 => self.arch,
                16..=63 if offset.is_multiple_of(4) => {
                    let at = usize::try_from(offset - 16).expect("small offset");
                    let bytes = self.args[at / 8].to_le_bytes();
                    let i = at % 8;
                    u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]])
                }
                _ => panic!("load of seccomp_data offset {offset}"),
            }
        }
    }

    /// Runs a classic BPF program the way the kernel's seccomp runs it, for
    /// the instructions seccompiler and `newer` emit.
    fn run(prog: &[seccompiler::sock_filter], data: &Data) -> u32 {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        loop {
            let i = &prog[pc];
            pc += 1;
            match i.code {
                0x20 => a = data.word(i.k), // ld [k]
                0x54 => a &= i.k,           // and #k
                0x05 => pc += i.k as usize, // ja
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match i.code {
                        0x15 => a == i.k,
                        0x25 => a > i.k,
                        0x35 => a >= i.k,
                        _ => a & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                0x06 => return i.k, // ret #k
                code => panic!("opcode {code:#x} at {}", pc - 1),
            }
        }
    }

    /// The answer of a stack of filters (oldest first), as the kernel picks
    /// it: the lowest action wins (KILL_PROCESS < ERRNO < ALLOW, compared as
    /// signed); on a tie the most recently installed filter's answer stays.
    fn stacked(progs: &[&[seccompiler::sock_filter]], data: &Data) -> u32 {
        let action = |r: u32| (r & 0xffff_0000) as i32;
        let mut ret = compile::RET_ALLOW;
        for prog in progs.iter().rev() {
            let r = run(prog, data);
            if action(r) < action(ret) {
                ret = r;
            }
        }
        ret
    }

    const ALLOWED: u32 = compile::RET_ALLOW;
    const EPERM: u32 = compile::RET_ERRNO | 1;
    const ENOSYS: u32 = compile::RET_ERRNO | 38;
    const KILL: u32 = compile::RET_KILL_PROCESS;

    /// A sandbox's filters on `arch`, as `install` stacks them.
    struct Stack {
        arch: TargetArch,
        progs: compile::Programs,
    }

    impl Stack {
        /// The compiled policy of `arch`, compiled once for all tests.
        fn new(arch: TargetArch) -> &'static Self {
            static X86_64: std::sync::OnceLock<Stack> = std::sync::OnceLock::new();
            static AARCH64: std::sync::OnceLock<Stack> = std::sync::OnceLock::new();
            let cell = match arch {
                TargetArch::x86_64 => &X86_64,
                TargetArch::aarch64 => &AARCH64,
                TargetArch::riscv64 => panic!("riscv64 is not supported"),
            };
            cell.get_or_init(|| Stack {
                arch,
                progs: programs(arch),
            })
        }

        fn nr(&self, name: &str) -> u32 {
            let nr = self
                .progs
                .numbers
                .get(name)
                .copied()
                .or_else(|| compile::syscall_number(name, self.arch));
            u32::try_from(nr.unwrap_or_else(|| panic!("{name}: no number"))).expect("small number")
        }

        fn answer(&self, userns: bool, name: &str, args: [u64; 6]) -> u32 {
            self.raw(userns, self.nr(name), compile::audit_arch(self.arch), args)
        }

        /// The answer of the program sifbox installs, checked against
        /// seccompiler's stacked programs for the same policy.
        fn raw(&self, userns: bool, nr: u32, arch: u32, args: [u64; 6]) -> u32 {
            let p = &self.progs;
            let data = Data { nr, arch, args };
            let (reference, single) = if userns {
                (
                    stacked(&[&p.default_userns, &p.enosys_userns, &p.newer], &data),
                    run(&p.single_userns, &data),
                )
            } else {
                (
                    stacked(&[&p.default, &p.enosys, &p.newer], &data),
                    run(&p.single, &data),
                )
            };
            assert_eq!(
                single, reference,
                "{:?} userns={userns} nr={nr} arch={arch:#x} args={args:x?}: the single program and seccompiler's disagree",
                self.arch
            );
            single
        }
    }

    fn args0(a: u64) -> [u64; 6] {
        [a, 0, 0, 0, 0, 0]
    }

    #[test]
    fn policy_has_no_problem_on_any_architecture() {
        let p = policy();
        for arch in compile::ARCHES {
            let found = compile::problems(&p, arch);
            assert!(found.is_empty(), "{arch:?}: {found:#?}");
        }
    }

    #[test]
    fn every_name_is_a_syscall_of_its_architectures() {
        let p = policy();
        for arch in compile::ARCHES {
            let v = p.view(arch);
            for name in v
                .allow
                .keys()
                .chain(v.enosys.keys())
                .chain(v.userns.keys())
                .chain(v.deny.keys())
                .copied()
                .chain(v.conditional.iter().map(|c| c.syscall.as_str()))
            {
                assert!(
                    compile::syscall_number(name, arch).is_some(),
                    "{name} is not a system call of {arch:?}"
                );
            }
        }
        // The x86_64-only tables hold names aarch64 does not have: a name
        // both have belongs in the shared table.
        for name in p.allow_x86_64.keys().chain(p.deny_x86_64.keys()) {
            assert!(
                compile::syscall_number(name, TargetArch::aarch64).is_none(),
                "{name} exists on aarch64 too: move it to the shared table"
            );
        }
    }

    #[test]
    fn no_name_twice_and_allow_and_deny_are_disjoint() {
        // A TOML table cannot repeat a key; across tables, by hand here
        // (independently of compile::problems).
        let p = policy();
        for arch in compile::ARCHES {
            let v = p.view(arch);
            let mut seen = BTreeSet::new();
            let conditional: Vec<&str> = v.conditional.iter().map(|c| c.syscall.as_str()).collect();
            for name in v
                .allow
                .keys()
                .chain(v.enosys.keys())
                .chain(v.deny.keys())
                .chain(conditional.iter())
            {
                assert!(seen.insert(*name), "{name} is in two tables on {arch:?}");
            }
            for name in v.deny.keys().chain(v.enosys.keys()) {
                assert!(!allowed_by_default(&v, name), "{name} denied and allowed");
            }
            for name in v.userns.keys() {
                assert!(
                    !v.allow.contains_key(name),
                    "[userns] {name} is already allowed"
                );
            }
        }
    }

    fn allowed_by_default(v: &compile::View<'_>, name: &str) -> bool {
        v.allow.contains_key(name) || v.conditional.iter().any(|c| c.syscall == name)
    }

    #[test]
    fn every_rule_has_a_reason() {
        let p = policy();
        let tables = [
            &p.allow,
            &p.allow_x86_64,
            &p.allow_aarch64,
            &p.enosys,
            &p.userns,
            &p.deny,
            &p.deny_x86_64,
            &p.deny_aarch64,
        ];
        for (name, reason) in tables.into_iter().flatten() {
            assert!(reason.trim().len() >= 3, "{name}: reason {reason:?}");
        }
        for c in &p.conditional {
            assert!(c.reason.trim().len() >= 3, "{}", c.syscall);
            assert!(!c.when.is_empty(), "{}", c.syscall);
            for alt in &c.when {
                assert!(alt.reason.trim().len() > 2, "{}", c.syscall);
            }
        }
    }

    #[test]
    fn the_must_deny_list_is_not_allowed_by_default() {
        for arch in compile::ARCHES {
            let stack = Stack::new(arch);
            let extra: &[&str] = if arch == TargetArch::x86_64 {
                MUST_DENY_X86_64
            } else {
                &[]
            };
            for name in MUST_DENY.iter().chain(extra) {
                let got = stack.answer(false, name, [0; 6]);
                assert!(
                    got == EPERM || got == ENOSYS,
                    "{arch:?}: {name} answers {got:#x}"
                );
            }
        }
        // And the accessors of this architecture agree.
        let allowed: BTreeSet<&str> = allowed(false).into_iter().collect();
        for name in MUST_DENY {
            assert!(!allowed.contains(name), "{name} is allowed");
        }
        for (name, _) in denied() {
            assert!(!allowed.contains(name), "{name} denied and allowed");
        }
    }

    /// Every call Docker's default profile lets a container make is allowed
    /// here too, or policy.toml says, naming Docker, why sifbox differs: a
    /// program that works under Docker fails here only for a reason written
    /// down. (The default policy once left out getrandom, and every TLS
    /// client failed.)
    #[test]
    fn every_call_docker_allows_is_allowed_or_justified() {
        let p = policy();
        let mut problems = Vec::new();
        let mut checked = 0;
        let lines = DOCKER_DEFAULT
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        for arch in compile::ARCHES {
            let v = p.view(arch);
            for line in lines.clone() {
                // `NAME if CHECK`: Docker too allows it only conditionally.
                let (name, docker_checks) = match line.split_once(" if ") {
                    Some((name, _)) => (name, true),
                    None => (line, false),
                };
                if compile::syscall_number(name, arch).is_none() {
                    continue;
                }
                checked += 1;
                if v.allow.contains_key(name) {
                    continue;
                }
                let says_why = |reason: &str| reason.contains("Docker");
                if let Some(c) = v.conditional.iter().find(|c| c.syscall == name) {
                    if !docker_checks && !says_why(&c.reason) {
                        problems.push(format!(
                            "{arch:?} {name}: Docker allows every use; its [[conditional]] reason must say why sifbox checks more (naming Docker)"
                        ));
                    }
                    continue;
                }
                match (v.enosys.get(name), v.deny.get(name)) {
                    (Some(_), _) if docker_checks => {}
                    (Some(reason), _) | (None, Some(reason)) if says_why(reason) => {}
                    (Some(_), _) | (None, Some(_)) => problems.push(format!(
                        "{arch:?} {name}: Docker allows it: its reason in policy.toml must say why sifbox does not (naming Docker)"
                    )),
                    (None, None) => problems.push(format!(
                        "{arch:?} {name}: Docker allows it, and policy.toml neither allows it nor says why not"
                    )),
                }
            }
        }
        // Both architectures, about 280 calls each: the list was read.
        assert!(checked > 500, "only {checked} names checked");
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        // The call whose absence broke TLS, answered as allowed by the
        // compiled programs of both architectures.
        for arch in compile::ARCHES {
            let s = Stack::new(arch);
            assert_eq!(s.answer(false, "getrandom", [0; 6]), ALLOWED, "{arch:?}");
        }
    }

    #[test]
    fn numbers_match_libc() {
        // Checks the number extraction from seccompiler's table against the
        // libc crate's constants for this architecture.
        let known: &[(&str, libc::c_long)] = &[
            ("read", libc::SYS_read),
            ("openat", libc::SYS_openat),
            ("clone", libc::SYS_clone),
            ("clone3", libc::SYS_clone3),
            ("unshare", libc::SYS_unshare),
            ("ioctl", libc::SYS_ioctl),
            ("socket", libc::SYS_socket),
            ("personality", libc::SYS_personality),
            ("keyctl", libc::SYS_keyctl),
            ("bpf", libc::SYS_bpf),
            ("userfaultfd", libc::SYS_userfaultfd),
            ("io_uring_setup", libc::SYS_io_uring_setup),
            ("mount", libc::SYS_mount),
            ("getpid", libc::SYS_getpid),
            ("mseal", libc::SYS_mseal),
            ("fchownat", libc::SYS_fchownat),
            ("setresuid", libc::SYS_setresuid),
        ];
        let numbers: std::collections::BTreeMap<&str, i64> = NUMBERS.iter().copied().collect();
        for (name, nr) in known {
            assert_eq!(numbers.get(name), Some(nr), "{name}");
        }
        assert_eq!(
            i64::from(NEWER_FROM),
            numbers.values().max().copied().unwrap_or(0) + 1
        );
    }

    #[test]
    fn the_included_programs_are_this_architectures_compilation() {
        let arch = TargetArch::try_from(std::env::consts::ARCH).expect("supported arch");
        let p = programs(arch);
        let same = |a: &[SockFilter], b: &[seccompiler::sock_filter]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| (x.code, x.jt, x.jf, x.k) == (y.code, y.jt, y.jf, y.k))
        };
        assert!(same(POLICY, &p.single));
        assert!(same(POLICY_USERNS, &p.single_userns));
        for prog in [program(false), program(true)] {
            // A short program is what makes installing it cheap.
            assert!(
                !prog.is_empty() && prog.len() < 300,
                "{} instructions",
                prog.len()
            );
        }
    }

    /// Argument values around every check the policy makes.
    fn interesting_args() -> Vec<u64> {
        let mut v = vec![
            0,
            1,
            2,
            8,
            17,
            40,
            0x80,
            0x5401,
            0x5412,
            0x541C,
            0x2_0000,
            0x2_0008,
            0x4_0000,
            0x40_0000,
            0x7E02_0000,
            0x7E02_0080,
            0x0120_0011,
            0x003d_0f00,
            0xffff_ffff,
            u64::MAX,
        ];
        for flag in 0..32 {
            v.push(1 << flag);
        }
        let high: Vec<u64> = v.iter().map(|x| x | 1 << 32).collect();
        v.extend(high);
        v
    }

    #[test]
    fn the_single_program_answers_as_seccompilers_for_every_call() {
        for arch in compile::ARCHES {
            let s = Stack::new(arch);
            let native = compile::audit_arch(arch);
            let mut nrs: Vec<u32> = (0..1100).collect();
            nrs.extend([0x4000_0000, 0x4000_0010, 0x4000_0200, 0x7fff_ffff, u32::MAX]);
            let args = interesting_args();
            for userns in [false, true] {
                for &nr in &nrs {
                    // `raw` asserts that both agree.
                    s.raw(userns, nr, native, [0; 6]);
                    s.raw(userns, nr, 0x4000_0003, [0; 6]);
                    for &a in &args {
                        s.raw(userns, nr, native, [a, a, 0, 0, 0, 0]);
                        s.raw(userns, nr, native, [a, 0x5412, 0, 0, 0, 0]);
                        s.raw(userns, nr, native, [0, a, 0, 0, 0, 0]);
                    }
                }
            }
        }
    }

    #[test]
    fn the_search_jumps_over_long_branches() {
        // Leaves longer than a conditional jump reaches (255 instructions)
        // need the JA form; today's policy never does, so build one.
        use compile::Leaf;
        let ret = |k| seccompiler::sock_filter {
            code: compile::BPF_RET_K,
            jt: 0,
            jf: 0,
            k,
        };
        let ranges = vec![
            (0, Leaf::Checks(vec![ret(1); 300])),
            (10, Leaf::Ret(2)),
            (20, Leaf::Checks(vec![ret(3); 600])),
            (30, Leaf::Ret(4)),
            (31, Leaf::Checks(vec![ret(5); 256])),
            (40, Leaf::Ret(6)),
        ];
        let mut prog = vec![seccompiler::sock_filter {
            code: compile::BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        }];
        prog.extend(compile::search(&ranges).expect("search"));
        assert!(prog.iter().any(|i| i.code == compile::BPF_JA));
        for nr in 0..60u32 {
            let want = match nr {
                0..=9 => 1,
                10..=19 => 2,
                20..=29 => 3,
                30 => 4,
                31..=39 => 5,
                _ => 6,
            };
            let data = Data {
                nr,
                arch: 0,
                args: [0; 6],
            };
            assert_eq!(run(&prog, &data), want, "nr {nr}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_single_program_agrees_on_random_arguments(
            pick in 0usize..5,
            args in proptest::array::uniform6(proptest::num::u64::ANY),
            userns in proptest::bool::ANY,
        ) {
            let names = ["clone", "unshare", "ioctl", "socket", "personality"];
            for arch in compile::ARCHES {
                let s = Stack::new(arch);
                s.answer(userns, names[pick], args);
            }
        }
    }

    #[test]
    fn allowed_and_denied_answers_on_every_architecture() {
        for arch in compile::ARCHES {
            let s = Stack::new(arch);
            let v = policy();
            let v = v.view(arch);
            for name in v.allow.keys() {
                assert_eq!(s.answer(false, name, [0; 6]), ALLOWED, "{arch:?} {name}");
                assert_eq!(s.answer(true, name, [0; 6]), ALLOWED, "{arch:?} {name}");
            }
            for name in v.deny.keys() {
                let want = if v.userns.contains_key(name) {
                    ALLOWED
                } else {
                    EPERM
                };
                assert_eq!(s.answer(false, name, [0; 6]), EPERM, "{arch:?} {name}");
                assert_eq!(s.answer(true, name, [0; 6]), want, "{arch:?} {name}");
            }
            for name in v.enosys.keys() {
                assert_eq!(s.answer(false, name, [0; 6]), ENOSYS, "{arch:?} {name}");
            }
            // clone3: ENOSYS by default, allowed with nested namespaces; io_uring
            // stays ENOSYS either way.
            assert_eq!(s.answer(true, "clone3", [0; 6]), ALLOWED);
            assert_eq!(s.answer(true, "io_uring_setup", [0; 6]), ENOSYS);
            assert_eq!(s.answer(true, "keyctl", [0; 6]), EPERM);
            // Everything the fakeroot filter fakes must be allowed here, or
            // this filter's EPERM would win over its errno 0.
            let faked: &[&str] = &[
                "fchown",
                "fchownat",
                "setuid",
                "setgid",
                "setreuid",
                "setregid",
                "setresuid",
                "setresgid",
                "setgroups",
                "setfsuid",
                "setfsgid",
            ];
            for name in faked {
                assert_eq!(s.answer(false, name, [0; 6]), ALLOWED, "{name}");
            }
            if arch == TargetArch::x86_64 {
                for name in ["chown", "lchown"] {
                    assert_eq!(s.answer(false, name, [0; 6]), ALLOWED, "{name}");
                }
            }
        }
    }

    #[test]
    fn clone_and_unshare_without_namespace_flags_only() {
        const NEWNS: u64 = 0x0002_0000;
        const NEWCGROUP: u64 = 0x0200_0000;
        const NEWUTS: u64 = 0x0400_0000;
        const NEWIPC: u64 = 0x0800_0000;
        const NEWUSER: u64 = 0x1000_0000;
        const NEWPID: u64 = 0x2000_0000;
        const NEWNET: u64 = 0x4000_0000;
        const NEWTIME: u64 = 0x80;
        // What glibc's fork and pthread_create pass.
        const FORK: u64 = 0x0120_0011; // CHILD_SETTID|CHILD_CLEARTID|SIGCHLD
        const THREAD: u64 = 0x003d_0f00;
        for arch in compile::ARCHES {
            let s = Stack::new(arch);
            for flags in [0, FORK, THREAD, 0x11] {
                assert_eq!(
                    s.answer(false, "clone", args0(flags)),
                    ALLOWED,
                    "{flags:#x}"
                );
            }
            for ns in [NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET] {
                for flags in [ns, ns | FORK, ns | 0xffff_ffff_0000_0000] {
                    assert_eq!(s.answer(false, "clone", args0(flags)), EPERM, "{flags:#x}");
                    assert_eq!(
                        s.answer(false, "unshare", args0(flags)),
                        EPERM,
                        "{flags:#x}"
                    );
                    assert_eq!(s.answer(true, "clone", args0(flags)), ALLOWED, "{flags:#x}");
                    assert_eq!(
                        s.answer(true, "unshare", args0(flags)),
                        ALLOWED,
                        "{flags:#x}"
                    );
                }
            }
            // CLONE_NEWTIME: unshare only (in clone it is the exit signal).
            assert_eq!(s.answer(false, "unshare", args0(NEWTIME)), EPERM);
            assert_eq!(s.answer(true, "unshare", args0(NEWTIME)), ALLOWED);
            // CLONE_FILES | CLONE_FS | CLONE_SYSVSEM
            assert_eq!(s.answer(false, "unshare", args0(0x0004_0600)), ALLOWED);
            assert_eq!(s.answer(false, "unshare", args0(0)), ALLOWED);
        }
    }

    #[test]
    fn ioctl_socket_and_personality_checks_see_what_the_kernel_sees() {
        const TIOCSTI: u64 = 0x5412;
        const TIOCLINUX: u64 = 0x541C;
        for arch in compile::ARCHES {
            let s = Stack::new(arch);
            let ioctl = |req: u64| s.answer(false, "ioctl", [1, req, 0, 0, 0, 0]);
            assert_eq!(ioctl(TIOCSTI), EPERM);
            assert_eq!(ioctl(TIOCLINUX), EPERM);
            // The kernel reads the request as an unsigned int: upper bits
            // must not make TIOCSTI pass (CVE-2019-10063 in Flatpak).
            assert_eq!(ioctl(TIOCSTI | 1 << 32), EPERM);
            assert_eq!(ioctl(TIOCLINUX | 0xdead_0000_0000_0000), EPERM);
            for allowed in [0x5401, 0x5413, 0x541B, 0x5414, 0x4020_5477] {
                assert_eq!(ioctl(allowed), ALLOWED, "{allowed:#x}");
            }
            let socket = |domain: u64| s.answer(false, "socket", args0(domain));
            assert_eq!(socket(40), EPERM);
            assert_eq!(socket(40 | 1 << 32), EPERM);
            for domain in [1, 2, 10, 16, 17] {
                assert_eq!(socket(domain), ALLOWED, "{domain}");
            }
            let persona = |p: u64| s.answer(false, "personality", args0(p));
            for p in [0, 8, 0x20000, 0x20008, 0x40000, 0xffff_ffff, 0x1_0000_0008] {
                assert_eq!(persona(p), ALLOWED, "{p:#x}");
            }
            // READ_IMPLIES_EXEC, PER_BSD, PER_SVR4, MMAP_PAGE_ZERO
            for p in [0x0040_0000, 0x6, 0x0400_0001, 0x0010_0000] {
                assert_eq!(persona(p), EPERM, "{p:#x}");
            }
        }
    }

    #[test]
    fn newer_calls_and_foreign_abis() {
        for arch in compile::ARCHES {
            let s = Stack::new(arch);
            let native = compile::audit_arch(arch);
            let from = s.progs.newer_from;
            // Calls newer than the policy (Linux 6.13's setxattrat is 463
            // on both architectures) look absent; holes below it are EPERM.
            assert_eq!(s.raw(false, from, native, [0; 6]), ENOSYS);
            assert_eq!(s.raw(false, from + 30, native, [0; 6]), ENOSYS);
            assert_eq!(s.raw(true, from, native, [0; 6]), ENOSYS);
            assert_eq!(s.raw(false, from - 1, native, [0; 6]), ALLOWED); // mseal
            assert_eq!(s.raw(false, u32::MAX, native, [0; 6]), ENOSYS);
            // Another ABI on the same machine is killed.
            let foreign = if arch == TargetArch::x86_64 {
                0x4000_0003 // AUDIT_ARCH_I386
            } else {
                0x4000_0028 // AUDIT_ARCH_ARM
            };
            assert_eq!(s.raw(false, 20, foreign, [0; 6]), KILL);
            assert_eq!(s.raw(true, 20, foreign, [0; 6]), KILL);
        }
        // x32 system calls (x86_64 numbers with bit 30) are not allowed.
        let s = Stack::new(TargetArch::x86_64);
        let x32_getpid = 0x4000_0000 | s.nr("getpid");
        assert_ne!(
            s.raw(
                false,
                x32_getpid,
                compile::audit_arch(TargetArch::x86_64),
                [0; 6]
            ),
            ALLOWED
        );
    }

    #[test]
    fn the_notifying_program_is_the_plain_one_with_eperm_made_a_notification() {
        for arch in compile::ARCHES {
            let p = programs(arch);
            for plain in [&p.single, &p.single_userns] {
                let notify = compile::notifying(plain);
                assert_eq!(notify.len(), plain.len());
                let mut changed = 0;
                for (a, b) in plain.iter().zip(&notify) {
                    if a.code == compile::BPF_RET_K && a.k == EPERM {
                        assert_eq!(b.k, compile::RET_USER_NOTIF);
                        assert_eq!((a.code, a.jt, a.jf), (b.code, b.jt, b.jf));
                        changed += 1;
                    } else {
                        assert_eq!(a, b, "{arch:?}: only EPERM answers change");
                    }
                }
                assert!(changed > 0, "{arch:?}: no EPERM answer to notify");
            }
        }
        // The generated programs of this architecture are the same.
        for userns in [false, true] {
            let plain = program(userns);
            let notify = notify_program(userns);
            assert_eq!(plain.len(), notify.len());
            for (a, b) in plain.iter().zip(notify) {
                if a.code == compile::BPF_RET_K && a.k == EPERM {
                    assert_eq!(b.k, compile::RET_USER_NOTIF);
                } else {
                    assert_eq!(a, b);
                }
            }
        }
        // Answers other than EPERM stay: an unknown call still gets ENOSYS,
        // a denied one is now heard.
        let s = Stack::new(TargetArch::x86_64);
        let data = |nr| Data {
            nr,
            arch: compile::audit_arch(TargetArch::x86_64),
            args: [0; 6],
        };
        let notify = compile::notifying(&s.progs.single);
        assert_eq!(run(&notify, &data(s.nr("keyctl"))), compile::RET_USER_NOTIF);
        assert_eq!(run(&notify, &data(s.nr("getpid"))), ALLOWED);
        assert_eq!(run(&notify, &data(s.nr("io_uring_setup"))), ENOSYS);
        assert_eq!(run(&notify, &data(s.progs.newer_from)), ENOSYS);
    }

    #[test]
    fn accessors_describe_the_policy() {
        let allowed_plain = allowed(false);
        let allowed_userns = allowed(true);
        assert!(allowed_plain.contains(&"read") && allowed_plain.contains(&"clone"));
        assert!(!allowed_plain.contains(&"mount") && allowed_userns.contains(&"mount"));
        assert!(enosys(false).iter().any(|(n, _)| *n == "clone3"));
        assert!(!enosys(true).iter().any(|(n, _)| *n == "clone3"));
        assert!(enosys(true).iter().any(|(n, _)| *n == "io_uring_setup"));
        assert!(denied()
            .iter()
            .any(|(n, r)| *n == "keyctl" && !r.is_empty()));
        assert!(conditional().iter().any(|(n, _)| *n == "ioctl"));
        assert!(userns().iter().any(|(n, _)| *n == "setns"));
        assert!(newer_from() > 400);
        assert_eq!(syscall_number("getpid"), Some(libc::SYS_getpid));
        assert_eq!(syscall_number("no_such_call"), None);
        assert_eq!(syscall_name(libc::SYS_getpid), Some("getpid"));
        assert_eq!(syscall_name(libc::SYS_keyctl), Some("keyctl"));
        assert_eq!(syscall_name(-1), None);
    }
}
