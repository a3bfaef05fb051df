//! `sifbox doctor`: what this host allows, and what to do about what it does not.
//!
//! Every check is bounded in time and never panics: a failure to look something up
//! becomes `ok = false` with the error in `detail`. Checks that must create
//! namespaces run the sifbox binary itself as a child (`sifbox __doctor-child KIND`),
//! because `unshare(CLONE_NEWUSER)` needs a fresh single-threaded process and
//! because a namespace (and every mount in it) should vanish with the process that
//! made it, leaving the caller untouched.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::io::Errno;

/// The hidden CLI argument that turns the sifbox binary into a doctor child.
mod child;
mod host;
mod limits;
mod overlay;
mod subids;
mod userns;

use host::*;
pub use limits::limits_plan;
use limits::*;
use overlay::*;
use subids::*;
use userns::*;

pub const CHILD_ARG: &str = "__doctor-child";

/// How long a namespace child may run before it is killed.
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `apptainer --version` may run before it is killed.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// The fix when a doctor child could not do its test at all.
const FIX_BROKEN_CHILD: &str = "the test could not run: doctor re-runs the sifbox binary \
    as `sifbox __doctor-child KIND` (before anything starts threads); run it from a complete \
    sifbox install, and if it hangs, look for a hung file system under TMPDIR";
/// Longest path a Unix socket address can hold (`sun_path` is 108 bytes with the NUL).
const SOCKET_PATH_MAX: usize = 107;

/// How far a check stands from what `sifbox run` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Works here.
    Ok,
    /// Missing, and sifbox does without it: the detail says what is lost
    /// and what sifbox does instead.
    Optional,
    /// Missing, and `sifbox run` cannot work without it: the exit status
    /// of `sifbox doctor` is 1.
    Fail,
}

/// The outcome of one check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// Stable name of the check ("user namespaces", "cgroup delegation", ...).
    pub name: &'static str,
    /// Whether this host allows it fully (`level` is `ok`).
    pub ok: bool,
    /// Ok, missing but optional, or missing and needed.
    pub level: Level,
    /// What was found (one line).
    pub detail: String,
    /// What to do about it; `None` when there is nothing to do.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            ok: true,
            level: Level::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// Missing, but `sifbox run` works without it: `detail` says what is
    /// lost and what sifbox does instead, `fix` how to have it.
    fn optional(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            ok: false,
            level: Level::Optional,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// Missing, and `sifbox run` cannot work without it.
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            ok: false,
            level: Level::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Whether any check says `sifbox run` cannot work here.
#[must_use]
pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.level == Level::Fail)
}

/// Runs every check. `self_exe` is the sifbox binary; checks that must create
/// namespaces run it as a child: `self_exe __doctor-child KIND` (KIND = "userns" |
/// "overlay"), because namespaces must be created in a fresh single-threaded process.
#[must_use]
pub fn run_checks(self_exe: &Path) -> Vec<Check> {
    let userns = check_user_namespaces(self_exe);
    let userns_ok = userns.ok;
    vec![
        check_kernel(),
        userns,
        check_subordinate_ids(),
        check_overlay(self_exe, userns_ok),
        check_cgroups(),
    ]
    .into_iter()
    .chain(limit_checks(&limits_plan(), kernel_version()))
    .chain([check_storage(crate::disk::unavailable())])
    .chain([check_dev_fuse(), check_runtime_dir(), check_apptainer()])
    .collect()
}

/// Entry point of `sifbox __doctor-child KIND`; returns the process exit code:
/// 0 works, 1 does not (printing one line on stderr saying why), 2 unknown kind.
///
/// On success a one-line note may be printed on stdout; the parent shows it.
pub fn child_main(kind: &str) -> i32 {
    let result = match kind {
        "userns" => child_userns(),
        "overlay" => child_overlay(),
        other => {
            eprintln!("unknown doctor check {other:?} (expected \"userns\" or \"overlay\")");
            return 2;
        }
    };
    match result {
        Ok(note) => {
            if !note.is_empty() {
                println!("{}", one_line(&note));
            }
            0
        }
        Err(why) => {
            eprintln!("{}", one_line(&why));
            1
        }
    }
}

/// Human table: one line per check: "  ok   NAME  detail",
/// "  opt  NAME  detail\n         to have it: ..." (missing, sifbox does
/// without) or "  FAIL NAME  detail\n         fix: ..." (plain ASCII,
/// aligned), then a line saying what the levels mean for `sifbox run`.
#[must_use]
pub fn render_text(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for check in checks {
        let (status, label) = match check.level {
            Level::Ok => ("ok  ", "fix:"),
            Level::Optional => ("opt ", "to have it:"),
            Level::Fail => ("FAIL", "fix:"),
        };
        let _ = writeln!(
            out,
            "  {status} {:<width$}  {}",
            check.name,
            one_line(&check.detail)
        );
        if let Some(fix) = &check.fix {
            let mut lines = fix.lines().map(one_line).filter(|l| !l.trim().is_empty());
            let pad = " ".repeat(label.len() + 1);
            if let Some(first) = lines.next() {
                let _ = writeln!(out, "         {label} {first}");
            }
            for more in lines {
                let _ = writeln!(out, "         {pad}{more}");
            }
        }
    }
    let optional = checks.iter().filter(|c| c.level == Level::Optional).count();
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    let _ = match (failed, optional) {
        (0, 0) => writeln!(out, "sifbox run works here, with everything."),
        (0, n) => writeln!(
            out,
            "sifbox run works here; {n} optional {} missing (opt: what is lost, and what \
             sifbox does instead).",
            if n == 1 { "thing is" } else { "things are" }
        ),
        (n, _) => writeln!(
            out,
            "sifbox run cannot work here: {n} {} (FAIL) to fix.",
            if n == 1 { "check" } else { "checks" }
        ),
    };
    out
}

// ---------------------------------------------------------------------------
// kernel

fn check_kernel() -> Check {
    let uname = rustix::system::uname();
    Check::ok("kernel", uname.release().to_string_lossy().into_owned())
}

// ---------------------------------------------------------------------------
// small helpers

/// The first file called `name` on PATH (then in `extra`) that is an executable file.
fn find_executable(name: &str, extra: &[&Path]) -> Option<(PathBuf, fs::Metadata)> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .filter(|d| d.is_absolute())
        .chain(extra.iter().map(|d| d.to_path_buf()))
        .map(|d| d.join(name))
        .find_map(|candidate| {
            let meta = fs::metadata(&candidate).ok()?;
            (meta.is_file() && meta.mode() & 0o111 != 0).then_some((candidate, meta))
        })
}

/// The file system type under `path`, by name where known.
fn fs_type_name(path: &Path) -> String {
    let Ok(st) = rustix::fs::statfs(path) else {
        return "an unknown file system".to_owned();
    };
    let magic = i128::from(st.f_type) & 0xFFFF_FFFF;
    let name = match magic {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p",
        0xFF53_4D42 | 0xFE53_4D42 => "cifs",
        0x2FC1_2FC1 => "zfs",
        0x6B41_4653 => "afs",
        0x0BD0_0BD0 => "lustre",
        0x4750_4653 => "gpfs",
        0x0027_E0EB => "cgroup",
        0x6367_7270 => "cgroup2",
        0x7363_6673 => "securityfs",
        0xF15F => "ecryptfs",
        0xCA45_1A4E => "bcachefs",
        0x7366_7362 => "squashfs",
        0x9FA0 => "proc",
        0x6265_6572 => "sysfs",
        _ => return format!("file system 0x{magic:x}"),
    };
    name.to_owned()
}

fn read_trimmed(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).rfind(|l| !l.is_empty())
}

/// Control characters (newlines included) become spaces, so a detail stays one line.
fn one_line(text: &str) -> String {
    text.trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// "EPERM (Operation not permitted)".
fn errno_text(e: Errno) -> String {
    let name = match e {
        Errno::PERM => "EPERM",
        Errno::NOENT => "ENOENT",
        Errno::ACCESS => "EACCES",
        Errno::INVAL => "EINVAL",
        Errno::NOSPC => "ENOSPC",
        Errno::USERS => "EUSERS",
        Errno::NOSYS => "ENOSYS",
        Errno::ROFS => "EROFS",
        Errno::BUSY => "EBUSY",
        Errno::NODEV => "ENODEV",
        Errno::NOTDIR => "ENOTDIR",
        Errno::OVERFLOW => "EOVERFLOW",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::NOMEM => "ENOMEM",
        Errno::EXIST => "EEXIST",
        Errno::XDEV => "EXDEV",
        _ => return std::io::Error::from(e).to_string(),
    };
    let text = std::io::Error::from(e).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
    format!("{name} ({text})")
}

fn io_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(raw) => errno_text(Errno::from_raw_os_error(raw)),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn subid_matches_name_or_uid() {
        let text = "\
# comment line
alice:100000:65536

bob:165536:65536
1000:300000:1000
alice:400000:10
  alice : 500000 : 5  
";
        assert_eq!(
            crate::idmap::subranges(text, Some("alice"), 1000),
            vec![
                crate::idmap::SubRange {
                    start: 100000,
                    count: 65536
                },
                crate::idmap::SubRange {
                    start: 300000,
                    count: 1000
                },
                crate::idmap::SubRange {
                    start: 400000,
                    count: 10
                },
                crate::idmap::SubRange {
                    start: 500000,
                    count: 5
                },
            ]
        );
        assert_eq!(
            crate::idmap::subranges(text, Some("bob"), 1001),
            vec![crate::idmap::SubRange {
                start: 165536,
                count: 65536
            }]
        );
        assert_eq!(
            crate::idmap::subranges(text, None, 1000),
            vec![crate::idmap::SubRange {
                start: 300000,
                count: 1000
            }]
        );
        assert_eq!(
            crate::idmap::subranges(text, Some("carol"), 1002),
            Vec::<crate::idmap::SubRange>::new()
        );
    }

    #[test]
    fn subid_skips_malformed_lines() {
        let text =
            "alice:100000\nalice:x:65536\nalice:1:2:3\nalice:5:0\n:1:2\nalice:-1:5\nalice:7:8\n";
        assert_eq!(
            crate::idmap::subranges(text, Some("alice"), 1000),
            vec![crate::idmap::SubRange { start: 7, count: 8 }]
        );
        // a uid string never matches a user whose name merely contains it
        assert_eq!(
            crate::idmap::subranges("10000:1:2\n", Some("x"), 1000),
            Vec::<crate::idmap::SubRange>::new()
        );
        assert_eq!(
            crate::idmap::SubRange {
                start: 100000,
                count: 65536
            }
            .to_string(),
            "100000-165535 (65536 ids)"
        );
    }

    #[test]
    fn passwd_lookup() {
        let text = "root:x:0:0:root:/root:/bin/bash\n# x\n+nis::1000:::\nalice:x:1000:1000::/home/alice:/bin/sh\nbroken\n";
        assert_eq!(crate::idmap::passwd_name(text, 0).as_deref(), Some("root"));
        assert_eq!(
            crate::idmap::passwd_name(text, 1000).as_deref(),
            Some("alice")
        );
        assert_eq!(crate::idmap::passwd_name(text, 1001), None);
    }

    #[test]
    fn every_limit_gets_a_line_saying_what_enforces_it() {
        use crate::limits::{plan, Host};
        let limits = every_limit();
        // No cgroup, an unprivileged user: the fallbacks, and what they
        // cannot promise.
        let host = Host {
            cgroup: None,
            cpus: vec![0, 1, 2, 3],
            root: false,
            ..Host::default()
        };
        let checks = limit_checks(&plan(&limits, &host, 0), (6, 1));
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "limit: memory",
                "limit: memory+swap",
                "limit: pids",
                "limit: cpus"
            ]
        );
        assert!(
            !checks[0].ok && checks[0].detail.contains("watchdog"),
            "{:?}",
            checks[0]
        );
        // A fallback is missing-but-optional, never a FAIL; each line
        // names the example flags its values are for.
        for c in &checks {
            assert_ne!(c.level, Level::Fail, "{c:?}");
            assert!(c.detail.starts_with("for `sifbox run --"), "{c:?}");
        }
        assert!(checks[3].detail.contains("--cpus 1.5"));
        assert!(checks[0].detail.contains("cannot promise"));
        assert!(!checks[1].ok && checks[1].detail.contains("not enforced: memory_swap"));
        assert!(checks[2].ok && checks[2].detail.contains("RLIMIT_NPROC"));
        assert!(
            !checks[3].ok && checks[3].detail.contains("rounded up"),
            "{:?}",
            checks[3]
        );
        // Before 5.14 the rlimit is the user's, host-wide.
        let old = limit_checks(&plan(&limits, &host, 0), (5, 10));
        assert!(!old[2].ok && old[2].detail.contains("whole host"));
        // Root without cgroups: no pids limit at all, said.
        let root = limit_checks(&plan(&limits, &Host { root: true, ..host }, 0), (6, 1));
        assert!(
            !root[2].ok && root[2].detail.contains("exempt"),
            "{:?}",
            root[2]
        );
        // A v1 cgroup: the kernel enforces every one.
        let v1 = Host {
            cgroup: Some(crate::limits::cgroup::Hierarchy::V1 {
                dirs: ["memory", "pids", "cpu"]
                    .iter()
                    .map(|c| crate::limits::cgroup::V1Dir {
                        controllers: vec![(*c).to_string()],
                        mount: PathBuf::from(format!("/sys/fs/cgroup/{c}")),
                        home: PathBuf::from(format!("/sys/fs/cgroup/{c}")),
                    })
                    .collect(),
                swap: true,
                quota: true,
            }),
            cpus: vec![0],
            root: true,
            ..Host::default()
        };
        let checks = limit_checks(&plan(&limits, &v1, 0), (6, 1));
        for c in &checks {
            assert!(c.ok && c.detail.contains("cgroup v1"), "{c:?}");
            assert!(c.fix.is_none());
        }
        assert!(checks[0].detail.contains("memory.limit_in_bytes"));
        assert!(
            checks[3].detail.contains("150000") && checks[3].detail.contains("1.5 CPUs"),
            "{:?}",
            checks[3]
        );
        let text = render_text(&checks);
        assert!(text.is_ascii() && text.lines().count() == 5, "{text}");
    }

    #[test]
    fn userns_fix_names_the_blocking_sysctl() {
        let knobs = UsernsKnobs {
            max: Some(0),
            clone: Some(0),
            apparmor: Some(1),
        };
        let fix = knobs.fix();
        assert!(fix.contains("user.max_user_namespaces=15000"));
        assert!(fix.contains("kernel.unprivileged_userns_clone=1"));
        assert!(fix.contains("kernel.apparmor_restrict_unprivileged_userns=0"));
        let open = UsernsKnobs {
            max: Some(1000),
            clone: None,
            apparmor: None,
        };
        assert!(open.fix().contains("seccomp"));
        assert!(knobs.restricts_unprivileged());
        assert!(!open.restricts_unprivileged());
        assert_eq!(open.describe(), "user.max_user_namespaces=1000");
    }

    #[test]
    fn text_table_is_aligned() {
        let checks = vec![
            Check::ok("kernel", "6.1"),
            Check::fail("/dev/fuse", "absent\nreally", "chmod it\nor not"),
            Check::optional("x", "gone; sifbox does y", "get it"),
        ];
        let text = render_text(&checks);
        assert_eq!(
            text,
            "  ok   kernel     6.1\n  FAIL /dev/fuse  absent really\n         fix: chmod it\n              or not\n  \
             opt  x          gone; sifbox does y\n         to have it: get it\n\
             sifbox run cannot work here: 1 check (FAIL) to fix.\n"
        );
        assert!(text.is_ascii());
        assert!(any_failed(&checks));
        // Missing but optional: no FAIL, and the summary says so.
        let fine = [Check::ok("kernel", "6.1"), checks[2].clone()];
        assert!(!any_failed(&fine));
        let text = render_text(&fine);
        assert!(!text.contains("FAIL"), "{text}");
        assert!(
            text.ends_with("sifbox run works here; 1 optional thing is missing (opt: what is lost, and what sifbox does instead).\n"),
            "{text}"
        );
    }

    #[test]
    fn unknown_child_kind() {
        assert_eq!(child_main("nonsense"), 2);
    }
}
