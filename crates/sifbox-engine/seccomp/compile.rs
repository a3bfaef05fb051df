//! Reads, checks and compiles `policy.toml` into seccomp BPF programs.
//!
//! Shared, by `#[path]`, between the build script (which compiles the
//! policy for the target's architecture into the binary) and the unit tests
//! of `src/seccomp.rs` (which compile it for every supported architecture
//! and run the programs in a BPF interpreter). It is plain data processing:
//! no system call is made here.

// The build script uses every item; the unit tests do not.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{
    sock_filter, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use serde::Deserialize;

/// `EPERM`: the answer to every system call the policy does not allow.
pub const EPERM: u32 = 1;
/// `ENOSYS`: the answer to the `[enosys]` set and to calls newer than the policy.
pub const ENOSYS: u32 = 38;

/// The architectures the policy is written for.
pub const ARCHES: [TargetArch; 2] = [TargetArch::x86_64, TargetArch::aarch64];

/// A syscall name mapped to its reason.
pub type Reasons = BTreeMap<String, String>;

/// `policy.toml` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub allow: Reasons,
    #[serde(default)]
    pub allow_x86_64: Reasons,
    #[serde(default)]
    pub allow_aarch64: Reasons,
    #[serde(default)]
    pub conditional: Vec<Conditional>,
    #[serde(default)]
    pub enosys: Reasons,
    #[serde(default)]
    pub userns: Reasons,
    #[serde(default)]
    pub deny: Reasons,
    #[serde(default)]
    pub deny_x86_64: Reasons,
    #[serde(default)]
    pub deny_aarch64: Reasons,
}

/// A system call allowed when its arguments pass a check.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conditional {
    pub syscall: String,
    pub reason: String,
    /// Alternatives, OR-ed.
    pub when: Vec<Alternative>,
}

/// Checks that must all hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alternative {
    pub reason: String,
    pub all: Vec<Check>,
}

/// One comparison of one argument.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Argument index, 0 to 5.
    pub arg: u8,
    /// Bits of the argument compared: 32 (the lower half) or 64.
    pub width: u8,
    pub op: Op,
    pub value: u64,
    /// Only for `masked_eq`: `(arg & mask) == value`.
    pub mask: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    MaskedEq,
}

/// The policy as it applies to one architecture.
#[derive(Debug)]
pub struct View<'a> {
    pub arch: TargetArch,
    /// Allowed without conditions.
    pub allow: BTreeMap<&'a str, &'a str>,
    /// Allowed when the arguments pass.
    pub conditional: Vec<&'a Conditional>,
    /// Answered ENOSYS.
    pub enosys: BTreeMap<&'a str, &'a str>,
    /// Allowed, without conditions, only with nested namespaces.
    pub userns: BTreeMap<&'a str, &'a str>,
    /// Documented denials.
    pub deny: BTreeMap<&'a str, &'a str>,
}

/// The compiled programs for one architecture.
#[derive(Debug)]
pub struct Programs {
    /// The allow-list: match allow, mismatch EPERM.
    pub default: Vec<sock_filter>,
    /// The allow-list plus the `[userns]` set.
    pub default_userns: Vec<sock_filter>,
    /// The `[enosys]` set: match ENOSYS, mismatch allow.
    pub enosys: Vec<sock_filter>,
    /// The `[enosys]` set less what `[userns]` allows.
    pub enosys_userns: Vec<sock_filter>,
    /// ENOSYS for every call numbered from `newer_from` on.
    pub newer: Vec<sock_filter>,
    /// The first number above every call the policy names.
    pub newer_from: u32,
    /// The whole policy in one program (what sifbox installs): a binary
    /// search over ranges of syscall numbers, equivalent to `default`,
    /// `enosys` and `newer` stacked (the tests check that), a tenth of the
    /// length, so the kernel takes a tenth of the time to install it.
    pub single: Vec<sock_filter>,
    /// The same for `default_userns`, `enosys_userns` and `newer`.
    pub single_userns: Vec<sock_filter>,
    /// The number of every name the policy uses on this architecture.
    pub numbers: BTreeMap<String, i64>,
}

/// Parses the policy text.
pub fn parse(text: &str) -> Result<Policy, String> {
    toml::from_str(text).map_err(|e| format!("seccomp/policy.toml: {e}"))
}

/// seccompiler's name for an architecture.
pub fn arch_name(arch: TargetArch) -> &'static str {
    match arch {
        TargetArch::x86_64 => "x86_64",
        TargetArch::aarch64 => "aarch64",
        TargetArch::riscv64 => "riscv64",
    }
}

/// `AUDIT_ARCH_*` of an architecture, as `seccomp_data.arch` holds it.
pub fn audit_arch(arch: TargetArch) -> u32 {
    match arch {
        TargetArch::x86_64 => 0xC000_003E,
        TargetArch::aarch64 => 0xC000_00B7,
        TargetArch::riscv64 => 0xC000_00F3,
    }
}

impl Policy {
    /// The tables that apply to `arch`.
    pub fn view(&self, arch: TargetArch) -> View<'_> {
        let (allow_arch, deny_arch) = match arch {
            TargetArch::x86_64 => (Some(&self.allow_x86_64), Some(&self.deny_x86_64)),
            TargetArch::aarch64 => (Some(&self.allow_aarch64), Some(&self.deny_aarch64)),
            TargetArch::riscv64 => (None, None),
        };
        View {
            arch,
            allow: merged(&self.allow, allow_arch),
            conditional: self.conditional.iter().collect(),
            enosys: merged(&self.enosys, None),
            userns: merged(&self.userns, None),
            deny: merged(&self.deny, deny_arch),
        }
    }

    /// Every (table, name, reason) of the file, whatever the architecture.
    fn entries(&self) -> Vec<(&'static str, &str, &str)> {
        let mut out = Vec::new();
        for (table, t) in [
            ("allow", &self.allow),
            ("allow_x86_64", &self.allow_x86_64),
            ("allow_aarch64", &self.allow_aarch64),
            ("enosys", &self.enosys),
            ("userns", &self.userns),
            ("deny", &self.deny),
            ("deny_x86_64", &self.deny_x86_64),
            ("deny_aarch64", &self.deny_aarch64),
        ] {
            for (k, v) in t {
                out.push((table, k.as_str(), v.as_str()));
            }
        }
        for c in &self.conditional {
            out.push(("conditional", c.syscall.as_str(), c.reason.as_str()));
        }
        out
    }
}

/// A table, plus the table of one architecture, borrowed.
fn merged<'a>(all: &'a Reasons, extra: Option<&'a Reasons>) -> BTreeMap<&'a str, &'a str> {
    all.iter()
        .chain(extra.into_iter().flatten())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The number of system call `name` on `arch`, from seccompiler's syscall
/// table; `None` if the table does not know the name.
///
/// seccompiler keeps its table private and offers it only through its JSON
/// front end, so this compiles a one-rule filter for the name and reads the
/// number back from the comparison the program makes: after the three
/// instructions that check the architecture, one loads the syscall number
/// and the next compares it with the rule's number.
pub fn syscall_number(name: &str, arch: TargetArch) -> Option<i64> {
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !plain {
        return None;
    }
    let json = format!(
        r#"{{"probe":{{"mismatch_action":"allow","match_action":{{"errno":1}},"filter":[{{"syscall":"{name}"}}]}}}}"#
    );
    let programs = seccompiler::compile_from_json(json.as_bytes(), arch).ok()?;
    let program = programs.get("probe")?;
    let load = program.get(3)?;
    let compare = program.get(4)?;
    let load_nr = sock_filter {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k: 0,
    };
    (*load == load_nr && compare.code == BPF_JEQ_K).then_some(i64::from(compare.k))
}

/// Everything wrong with the policy on `arch`, one line each.
pub fn problems(policy: &Policy, arch: TargetArch) -> Vec<String> {
    let mut out = Vec::new();
    let a = arch_name(arch);
    for (table, name, reason) in policy.entries() {
        if reason.trim().len() < 3 {
            out.push(format!("[{table}] {name}: the reason is missing or empty"));
        }
    }
    for (general, specific, table) in [
        (&policy.allow, &policy.allow_x86_64, "allow_x86_64"),
        (&policy.allow, &policy.allow_aarch64, "allow_aarch64"),
        (&policy.deny, &policy.deny_x86_64, "deny_x86_64"),
        (&policy.deny, &policy.deny_aarch64, "deny_aarch64"),
    ] {
        for name in specific.keys().filter(|n| general.contains_key(*n)) {
            out.push(format!(
                "{name} is in [{table}] and in the table for every architecture"
            ));
        }
    }
    let view = policy.view(arch);
    let placed: Vec<(&str, &str)> = view
        .allow
        .keys()
        .map(|n| (*n, "allow"))
        .chain(
            view.conditional
                .iter()
                .map(|c| (c.syscall.as_str(), "conditional")),
        )
        .chain(view.enosys.keys().map(|n| (*n, "enosys")))
        .chain(view.deny.keys().map(|n| (*n, "deny")))
        .collect();
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, table) in placed {
        if let Some(prev) = seen.insert(name, table) {
            out.push(format!(
                "{name} is in [{prev}] and [{table}]: one rule per system call (only [userns] may repeat a name, to lift its restriction)"
            ));
        }
    }
    let restricted: BTreeSet<&str> = view
        .conditional
        .iter()
        .map(|c| c.syscall.as_str())
        .chain(view.enosys.keys().copied())
        .chain(view.deny.keys().copied())
        .collect();
    for name in view.userns.keys() {
        if view.allow.contains_key(name) {
            out.push(format!(
                "[userns] {name}: already allowed without conditions"
            ));
        } else if !restricted.contains(name) {
            out.push(format!(
                "[userns] {name}: also list it in [conditional], [enosys] or [deny], to say what a sandbox without nested namespaces gets"
            ));
        }
    }
    let mut names: BTreeSet<&str> = BTreeSet::new();
    names.extend(view.allow.keys());
    names.extend(view.conditional.iter().map(|c| c.syscall.as_str()));
    names.extend(view.enosys.keys());
    names.extend(view.userns.keys());
    names.extend(view.deny.keys());
    for name in names {
        if syscall_number(name, arch).is_none() {
            out.push(format!(
                "{name}: not a system call of {a} in seccompiler's table"
            ));
        }
    }
    for c in &view.conditional {
        if c.when.is_empty() {
            out.push(format!(
                "[conditional] {}: no `when` alternative",
                c.syscall
            ));
        }
        for alt in &c.when {
            if alt.reason.trim().len() < 3 {
                out.push(format!(
                    "[conditional] {}: an alternative has no reason",
                    c.syscall
                ));
            }
            if alt.all.is_empty() {
                out.push(format!(
                    "[conditional] {}: an alternative has no check (use [allow])",
                    c.syscall
                ));
            }
            for check in &alt.all {
                if let Err(e) = condition(check) {
                    out.push(format!("[conditional] {}: {e}", c.syscall));
                }
            }
        }
    }
    out
}

/// seccompiler's form of a check.
fn condition(check: &Check) -> Result<SeccompCondition, String> {
    let len = match check.width {
        32 => SeccompCmpArgLen::Dword,
        64 => SeccompCmpArgLen::Qword,
        w => return Err(format!("width {w}: must be 32 or 64")),
    };
    let fits = |v: u64| check.width == 64 || v <= u64::from(u32::MAX);
    if !fits(check.value) || !check.mask.is_none_or(fits) {
        return Err(format!("value or mask wider than {} bits", check.width));
    }
    let op = match (check.op, check.mask) {
        (Op::MaskedEq, Some(mask)) => SeccompCmpOp::MaskedEq(mask),
        (Op::MaskedEq, None) => return Err("masked_eq needs a mask".into()),
        (_, Some(_)) => return Err("only masked_eq takes a mask".into()),
        (Op::Eq, None) => SeccompCmpOp::Eq,
        (Op::Ne, None) => SeccompCmpOp::Ne,
        (Op::Lt, None) => SeccompCmpOp::Lt,
        (Op::Le, None) => SeccompCmpOp::Le,
        (Op::Gt, None) => SeccompCmpOp::Gt,
        (Op::Ge, None) => SeccompCmpOp::Ge,
    };
    if check.arg > 5 {
        return Err(format!(
            "argument {}: system calls have six (0 to 5)",
            check.arg
        ));
    }
    SeccompCondition::new(check.arg, len, op, check.value).map_err(|e| e.to_string())
}

/// The number of `name`, or an error naming it.
fn number(name: &str, arch: TargetArch) -> Result<i64, String> {
    syscall_number(name, arch)
        .ok_or_else(|| format!("{name}: not a system call of {}", arch_name(arch)))
}

/// One seccompiler filter to BPF.
fn build(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
    arch: TargetArch,
) -> Result<Vec<sock_filter>, String> {
    let filter = SeccompFilter::new(rules, mismatch, matched, arch).map_err(|e| e.to_string())?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

/// The rules of the allow-list, with or without the `[userns]` set.
fn allow_rules(view: &View<'_>, userns: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let arch = view.arch;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for name in view.allow.keys() {
        rules.insert(number(name, arch)?, Vec::new());
    }
    for c in &view.conditional {
        if userns && view.userns.contains_key(c.syscall.as_str()) {
            continue;
        }
        let mut alternatives = Vec::new();
        for alt in &c.when {
            let checks = alt
                .all
                .iter()
                .map(condition)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{}: {e}", c.syscall))?;
            alternatives.push(SeccompRule::new(checks).map_err(|e| e.to_string())?);
        }
        rules.insert(number(&c.syscall, arch)?, alternatives);
    }
    if userns {
        for name in view.userns.keys() {
            rules.insert(number(name, arch)?, Vec::new());
        }
    }
    Ok(rules)
}

/// Classic BPF opcodes used by the hand-assembled `newer` program (and to
/// read seccompiler's output back).
pub const BPF_LD_W_ABS: u16 = 0x20;
pub const BPF_JEQ_K: u16 = 0x15;
pub const BPF_JGT_K: u16 = 0x25;
pub const BPF_RET_K: u16 = 0x06;
/// `SECCOMP_RET_*` actions.
pub const RET_ALLOW: u32 = 0x7fff_0000;
pub const RET_ERRNO: u32 = 0x0005_0000;
pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
/// `SECCOMP_RET_USER_NOTIF`: the caller waits for the filter's listener.
pub const RET_USER_NOTIF: u32 = 0x7fc0_0000;

/// `program` with every EPERM answer turned into a user notification, so
/// that a listener hears each denial (and answers it EPERM itself). Other
/// answers stay: allowed calls never reach the listener, and ENOSYS (calls
/// newer than the policy, the ENOSYS set) and kills are answered by the
/// kernel as before.
pub fn notifying(program: &[sock_filter]) -> Vec<sock_filter> {
    program
        .iter()
        .map(|i| {
            let mut i = i.clone();
            if i.code == BPF_RET_K && i.k == RET_ERRNO | EPERM {
                i.k = RET_USER_NOTIF;
            }
            i
        })
        .collect()
}

/// ENOSYS for every system call numbered `from` or above, on `arch` only:
/// calls newer than the policy look absent, so callers fall back (seccompiler
/// has no range comparisons, hence six instructions by hand). A call made
/// through another ABI is left to the main program, which kills it.
fn newer_program(arch: TargetArch, from: u32) -> Vec<sock_filter> {
    let i = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        i(BPF_LD_W_ABS, 0, 0, 4),             // A = seccomp_data.arch
        i(BPF_JEQ_K, 0, 3, audit_arch(arch)), // another ABI: allow (line 5)
        i(BPF_LD_W_ABS, 0, 0, 0),             // A = seccomp_data.nr
        i(BPF_JGT_K, 0, 1, from - 1),         // nr >= from: ENOSYS (line 4)
        i(BPF_RET_K, 0, 0, RET_ERRNO | ENOSYS),
        i(BPF_RET_K, 0, 0, RET_ALLOW),
    ]
}

pub const BPF_JGE_K: u16 = 0x35;
pub const BPF_JA: u16 = 0x05;

/// What a range of system call numbers gets in [`single_program`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leaf {
    /// One answer for the whole range.
    Ret(u32),
    /// A conditional system call: seccompiler's code for its argument
    /// checks, which starts by loading the number again and ends in returns.
    Checks(Vec<sock_filter>),
}

/// seccompiler's code for one conditional system call, taken from a
/// program of that call alone less the three instructions that check the
/// architecture: BPF jumps only forward, so every jump in the rest stays in
/// the rest, and every path ends in a return (allow, or EPERM).
fn checks_block(
    nr: i64,
    rules: Vec<SeccompRule>,
    arch: TargetArch,
) -> Result<Vec<sock_filter>, String> {
    let program = build(
        BTreeMap::from([(nr, rules)]),
        SeccompAction::Errno(EPERM),
        SeccompAction::Allow,
        arch,
    )?;
    let i = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    let prologue = [
        i(BPF_LD_W_ABS, 0, 0, 4),
        i(BPF_JEQ_K, 1, 0, audit_arch(arch)),
        i(BPF_RET_K, 0, 0, RET_KILL_PROCESS),
    ];
    match program.split_at_checked(3) {
        Some((head, rest)) if head == prologue && !rest.is_empty() => Ok(rest.to_vec()),
        _ => Err(format!(
            "unexpected seccompiler output for system call {nr}"
        )),
    }
}

/// A binary search over `ranges` (sorted starts; each range ends where the
/// next starts, the last at the largest number), with the number in A.
pub fn search(ranges: &[(u32, Leaf)]) -> Result<Vec<sock_filter>, String> {
    let i = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    match ranges {
        [] => Err("no range".into()),
        [(_, Leaf::Ret(k))] => Ok(vec![i(BPF_RET_K, 0, 0, *k)]),
        [(_, Leaf::Checks(block))] => Ok(block.clone()),
        _ => {
            let (low, high) = ranges.split_at(ranges.len() / 2);
            let pivot = high[0].0;
            let low = search(low)?;
            let high = search(high)?;
            // A >= pivot: the high half, after the low one.
            let mut out = match u8::try_from(low.len()) {
                Ok(skip) => vec![i(BPF_JGE_K, skip, 0, pivot)],
                Err(_) => {
                    let skip = u32::try_from(low.len()).map_err(|e| e.to_string())?;
                    vec![i(BPF_JGE_K, 0, 1, pivot), i(BPF_JA, 0, 0, skip)]
                }
            };
            out.extend(low);
            out.extend(high);
            Ok(out)
        }
    }
}

/// The whole policy (allow-list, ENOSYS set, calls newer than the policy)
/// as one program: the architecture check, then a binary search over the
/// ranges of numbers that get the same answer. Allowed calls are mostly
/// consecutive numbers, so some forty ranges replace seccompiler's linear
/// chain of three hundred comparisons; the argument checks are
/// seccompiler's own code.
pub fn single_program(
    view: &View<'_>,
    userns: bool,
    newer_from: u32,
) -> Result<Vec<sock_filter>, String> {
    let arch = view.arch;
    let nr32 = |name: &str| -> Result<u32, String> {
        u32::try_from(number(name, arch)?).map_err(|e| format!("{name}: {e}"))
    };
    let mut at: BTreeMap<u32, Leaf> = BTreeMap::new();
    for name in view.allow.keys() {
        at.insert(nr32(name)?, Leaf::Ret(RET_ALLOW));
    }
    for (name, _) in view
        .enosys
        .iter()
        .filter(|(n, _)| !(userns && view.userns.contains_key(*n)))
    {
        at.insert(nr32(name)?, Leaf::Ret(RET_ERRNO | ENOSYS));
    }
    let conditional = allow_rules(view, userns)?;
    for c in &view.conditional {
        if userns && view.userns.contains_key(c.syscall.as_str()) {
            continue;
        }
        let nr = number(&c.syscall, arch)?;
        let rules = conditional.get(&nr).cloned().unwrap_or_default();
        at.insert(
            nr32(&c.syscall)?,
            Leaf::Checks(checks_block(nr, rules, arch)?),
        );
    }
    if userns {
        for name in view.userns.keys() {
            at.insert(nr32(name)?, Leaf::Ret(RET_ALLOW));
        }
    }
    // Ranges: every number below `newer_from` gets its entry or EPERM;
    // consecutive numbers with the same answer merge.
    let mut ranges: Vec<(u32, Leaf)> = Vec::new();
    for nr in 0..newer_from {
        let leaf = at.remove(&nr).unwrap_or(Leaf::Ret(RET_ERRNO | EPERM));
        let same = matches!(ranges.last(), Some((_, last)) if *last == leaf && matches!(leaf, Leaf::Ret(_)));
        if !same {
            ranges.push((nr, leaf));
        }
    }
    if let Some(nr) = at.keys().next() {
        return Err(format!(
            "system call {nr} is above the newest the policy names"
        ));
    }
    ranges.push((newer_from, Leaf::Ret(RET_ERRNO | ENOSYS)));
    let i = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    let mut out = vec![
        i(BPF_LD_W_ABS, 0, 0, 4),
        i(BPF_JEQ_K, 1, 0, audit_arch(arch)),
        i(BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        i(BPF_LD_W_ABS, 0, 0, 0),
    ];
    out.extend(search(&ranges)?);
    if out.len() > 4096 {
        return Err(format!(
            "the program has {} instructions, more than 4096",
            out.len()
        ));
    }
    Ok(out)
}

/// Compiles the policy for `arch`; fails with every problem found.
pub fn compile(policy: &Policy, arch: TargetArch) -> Result<Programs, String> {
    let found = problems(policy, arch);
    if !found.is_empty() {
        return Err(format!(
            "seccomp/policy.toml has {} problem(s) on {}:\n  {}",
            found.len(),
            arch_name(arch),
            found.join("\n  ")
        ));
    }
    let view = policy.view(arch);
    let perm = SeccompAction::Errno(EPERM);
    let nosys = SeccompAction::Errno(ENOSYS);
    let default = build(
        allow_rules(&view, false)?,
        perm.clone(),
        SeccompAction::Allow,
        arch,
    )?;
    let default_userns = build(allow_rules(&view, true)?, perm, SeccompAction::Allow, arch)?;
    let enosys_rules = |userns: bool| -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
        let mut rules = BTreeMap::new();
        for name in view.enosys.keys() {
            if !(userns && view.userns.contains_key(name)) {
                rules.insert(number(name, arch)?, Vec::new());
            }
        }
        Ok(rules)
    };
    let enosys = build(
        enosys_rules(false)?,
        SeccompAction::Allow,
        nosys.clone(),
        arch,
    )?;
    let enosys_userns = build(enosys_rules(true)?, SeccompAction::Allow, nosys, arch)?;
    let mut numbers = BTreeMap::new();
    let names = view
        .allow
        .keys()
        .copied()
        .chain(view.conditional.iter().map(|c| c.syscall.as_str()))
        .chain(view.enosys.keys().copied())
        .chain(view.userns.keys().copied())
        .chain(view.deny.keys().copied());
    for name in names {
        numbers.insert(name.to_string(), number(name, arch)?);
    }
    let highest = numbers.values().copied().max().unwrap_or(0);
    let newer_from = u32::try_from(highest + 1).map_err(|e| e.to_string())?;
    Ok(Programs {
        single: single_program(&view, false, newer_from)?,
        single_userns: single_program(&view, true, newer_from)?,
        default,
        default_userns,
        enosys,
        enosys_userns,
        newer: newer_program(arch, newer_from),
        newer_from,
        numbers,
    })
}
