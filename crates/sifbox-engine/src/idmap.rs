//! Resolving `--userns auto|single|full` into concrete uid/gid maps, and
//! writing maps for another process (newuidmap/newgidmap, or directly as root).

use std::path::{Path, PathBuf};
use std::process::Command;

use sifbox_sys::syscall::Syscall;

use crate::error::{IoContext, Result};
use crate::spec::{IdMapping, IdRange, UsernsMode};

pub(crate) mod error;
pub use error::{IdMapError, SubidsMissing};

/// A subordinate id range from /etc/subuid or /etc/subgid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubRange {
    pub start: u32,
    pub count: u32,
}

impl std::fmt::Display for SubRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let last = u64::from(self.start) + u64::from(self.count.saturating_sub(1));
        write!(f, "{}-{} ({} ids)", self.start, last, self.count)
    }
}

/// Every range for `name` or `id` in the text of /etc/subuid or
/// /etc/subgid (`owner:start:count` lines; comments, blank, empty and
/// malformed lines skipped).
pub fn subranges(text: &str, name: Option<&str>, id: u32) -> Vec<SubRange> {
    let id = id.to_string();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split(':');
            let owner = f.next()?.trim();
            let start = f.next()?.trim().parse().ok()?;
            let count = f.next()?.trim().parse().ok()?;
            (f.next().is_none() && (Some(owner) == name || owner == id))
                .then_some(SubRange { start, count })
        })
        .filter(|r| r.count > 0)
        .collect()
}

/// The first range for `name` or `id` (see [`subranges`]).
pub fn find_subrange(text: &str, name: Option<&str>, id: u32) -> Option<SubRange> {
    subranges(text, name, id).into_iter().next()
}

/// Looks up the user name of `uid` in /etc/passwd.
pub fn user_name(uid: u32) -> Option<String> {
    passwd_name(&std::fs::read_to_string("/etc/passwd").ok()?, uid)
}

/// The user name of `uid` in an /etc/passwd text (NIS `+`/`-` lines skipped).
pub fn passwd_name(text: &str, uid: u32) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(['+', '-']))
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let _pw = f.next()?;
            (f.next()?.parse::<u32>().ok()? == uid && !name.is_empty()).then(|| name.to_string())
        })
}

/// Finds an executable on PATH or in /usr/bin, /bin.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Who is asking, and what the host offers them.
#[derive(Debug, Clone)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub subuid: Option<SubRange>,
    pub subgid: Option<SubRange>,
    pub newuidmap: Option<PathBuf>,
    pub newgidmap: Option<PathBuf>,
}

impl Caller {
    /// Reads the caller's ids and subordinate ranges from the host.
    pub fn current() -> Caller {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let (subuid_text, subgid_text) = (read("/etc/subuid"), read("/etc/subgid"));
        // Only look the name up when some line could name us.
        let name = (!subuid_text.is_empty() || !subgid_text.is_empty())
            .then(|| user_name(uid))
            .flatten();
        // Root writes maps itself and needs no helper.
        let tool = |t: &str| if uid == 0 { None } else { find_tool(t) };
        Caller {
            uid,
            gid,
            subuid: find_subrange(&subuid_text, name.as_deref(), uid),
            subgid: find_subrange(&subgid_text, name.as_deref(), uid),
            newuidmap: tool("newuidmap"),
            newgidmap: tool("newgidmap"),
        }
    }

    fn full_available(&self) -> bool {
        self.subuid.is_some()
            && self.subgid.is_some()
            && self.newuidmap.is_some()
            && self.newgidmap.is_some()
    }
}

/// Number of ids root maps (identity) when it has no subordinate range.
const ROOT_IDENTITY_COUNT: u32 = 65536;

/// Resolves a user-namespace mode for `caller`.
pub fn resolve(mode: UsernsMode, caller: &Caller) -> Result<IdMapping> {
    let single = |uid: u32, gid: u32| IdMapping {
        mode: UsernsMode::Single,
        uid: vec![IdRange {
            inside: 0,
            outside: uid,
            count: 1,
        }],
        gid: vec![IdRange {
            inside: 0,
            outside: gid,
            count: 1,
        }],
        external: false,
    };
    let with_sub = |sub_u: SubRange, sub_g: SubRange| IdMapping {
        mode: UsernsMode::Full,
        uid: vec![
            IdRange {
                inside: 0,
                outside: caller.uid,
                count: 1,
            },
            IdRange {
                inside: 1,
                outside: sub_u.start,
                count: sub_u.count,
            },
        ],
        gid: vec![
            IdRange {
                inside: 0,
                outside: caller.gid,
                count: 1,
            },
            IdRange {
                inside: 1,
                outside: sub_g.start,
                count: sub_g.count,
            },
        ],
        external: true,
    };
    if caller.uid == 0 {
        // Root may write any map itself. Its namespace root is still only
        // root *inside*: no capability reaches the host's namespaces.
        return Ok(match mode {
            UsernsMode::Single => single(0, caller.gid),
            UsernsMode::Auto | UsernsMode::Full => match (caller.subuid, caller.subgid) {
                (Some(u), Some(g)) if u.start > 0 && g.start > 0 => with_sub(u, g),
                _ => IdMapping {
                    mode: UsernsMode::Full,
                    uid: vec![IdRange {
                        inside: 0,
                        outside: 0,
                        count: ROOT_IDENTITY_COUNT,
                    }],
                    gid: vec![IdRange {
                        inside: 0,
                        outside: 0,
                        count: ROOT_IDENTITY_COUNT,
                    }],
                    external: true,
                },
            },
        });
    }
    match mode {
        UsernsMode::Single => Ok(single(caller.uid, caller.gid)),
        UsernsMode::Auto if !caller.full_available() => Ok(single(caller.uid, caller.gid)),
        UsernsMode::Auto | UsernsMode::Full => match (caller.subuid, caller.subgid) {
            (Some(u), Some(g)) if caller.newuidmap.is_some() && caller.newgidmap.is_some() => {
                Ok(with_sub(u, g))
            }
            (u, g) => {
                let missing = match (u, g, &caller.newuidmap, &caller.newgidmap) {
                    (None, _, _, _) => SubidsMissing::Subuid,
                    (_, None, _, _) => SubidsMissing::Subgid,
                    _ => SubidsMissing::Tools,
                };
                Err(IdMapError::NoSubids(missing).into())
            }
        },
    }
}

fn map_args(ranges: &[IdRange]) -> Vec<String> {
    ranges
        .iter()
        .flat_map(|r| {
            [
                r.inside.to_string(),
                r.outside.to_string(),
                r.count.to_string(),
            ]
        })
        .collect()
}

/// The text of a map file for `ranges`.
pub fn map_text(ranges: &[IdRange]) -> String {
    ranges
        .iter()
        .map(|r| format!("{} {} {}\n", r.inside, r.outside, r.count))
        .collect()
}

/// Writes the maps of `mapping` for process `pid` from outside its user
/// namespace: directly when the caller is root, else through
/// newuidmap/newgidmap.
pub fn write_external(
    sys: &dyn Syscall,
    pid: i32,
    mapping: &IdMapping,
    caller: &Caller,
) -> Result<()> {
    if caller.uid == 0 {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        write_file(sys, &proc.join("uid_map"), &map_text(&mapping.uid))?;
        write_file(sys, &proc.join("gid_map"), &map_text(&mapping.gid))?;
        return Ok(());
    }
    for (tool, ranges, which) in [
        (&caller.newuidmap, &mapping.uid, "newuidmap"),
        (&caller.newgidmap, &mapping.gid, "newgidmap"),
    ] {
        let tool = tool
            .as_ref()
            .ok_or(IdMapError::NoSubids(SubidsMissing::Tool(which)))?;
        let out = Command::new(tool)
            .arg(pid.to_string())
            .args(map_args(ranges))
            .output()
            .ctx(|| format!("running {}", tool.display()))?;
        if !out.status.success() {
            return Err(IdMapError::ToolFailed {
                tool: which,
                pid,
                args: map_args(ranges).join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }
            .into());
        }
    }
    Ok(())
}

/// Writes `text` to a /proc map file (or `setgroups`) in one write, as
/// the kernel requires, through the syscall seam.
pub fn write_file(sys: &dyn Syscall, path: &Path, text: &str) -> Result<(), IdMapError> {
    sys.write_file(rustix::fs::CWD, path, text.as_bytes())
        .map_err(|errno| IdMapError::Write {
            path: path.to_path_buf(),
            errno,
        })
}

/// The identity map over every id mapped by `outer` (used for the nested
/// namespace that locks the sandbox's mounts). One line per outer line: the
/// kernel requires each line's range to lie within a single line of the
/// parent's map.
pub fn identity_of(outer: &[IdRange]) -> Vec<IdRange> {
    outer
        .iter()
        .map(|r| IdRange {
            inside: r.inside,
            outside: r.inside,
            count: r.count,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, sub: bool, tools: bool) -> Caller {
        let r = sub.then_some(SubRange {
            start: 100000,
            count: 65536,
        });
        let t = tools.then(|| PathBuf::from("/usr/bin/newuidmap"));
        Caller {
            uid,
            gid: uid,
            subuid: r,
            subgid: r,
            newuidmap: t.clone(),
            newgidmap: t,
        }
    }

    #[test]
    fn subrange_lookup() {
        let text = "# x\nalice:100000:65536\n1001:200000:1000\nbob:1:0\nbad line\n";
        assert_eq!(
            find_subrange(text, Some("alice"), 1000),
            Some(SubRange {
                start: 100000,
                count: 65536
            })
        );
        assert_eq!(
            find_subrange(text, Some("carol"), 1001),
            Some(SubRange {
                start: 200000,
                count: 1000
            })
        );
        assert_eq!(find_subrange(text, Some("bob"), 7), None);
        assert_eq!(find_subrange(text, None, 5), None);
    }

    #[test]
    fn auto_falls_back_to_single() {
        let m = resolve(UsernsMode::Auto, &caller(1000, false, true)).expect("resolve");
        assert_eq!(m.mode, UsernsMode::Single);
        assert!(!m.external);
        assert_eq!(
            m.uid,
            vec![IdRange {
                inside: 0,
                outside: 1000,
                count: 1
            }]
        );
        let m = resolve(UsernsMode::Auto, &caller(1000, true, false)).expect("resolve");
        assert_eq!(m.mode, UsernsMode::Single);
    }

    #[test]
    fn full_maps_range_after_own_id() {
        let m = resolve(UsernsMode::Auto, &caller(1000, true, true)).expect("resolve");
        assert_eq!(m.mode, UsernsMode::Full);
        assert!(m.external);
        assert_eq!(m.uid_count(), 65537);
        assert_eq!(
            m.uid[1],
            IdRange {
                inside: 1,
                outside: 100000,
                count: 65536
            }
        );
        assert!(resolve(UsernsMode::Full, &caller(1000, false, true)).is_err());
        assert!(resolve(UsernsMode::Full, &caller(1000, true, false)).is_err());
    }

    #[test]
    fn root_gets_identity_without_range() {
        let m = resolve(UsernsMode::Auto, &caller(0, false, false)).expect("resolve");
        assert_eq!(
            m.uid,
            vec![IdRange {
                inside: 0,
                outside: 0,
                count: 65536
            }]
        );
        let m = resolve(UsernsMode::Single, &caller(0, false, false)).expect("resolve");
        assert_eq!(m.uid_count(), 1);
    }

    #[test]
    fn identity_covers_all() {
        let outer = [
            IdRange {
                inside: 0,
                outside: 1000,
                count: 1,
            },
            IdRange {
                inside: 1,
                outside: 100000,
                count: 65536,
            },
        ];
        assert_eq!(
            identity_of(&outer),
            vec![
                IdRange {
                    inside: 0,
                    outside: 0,
                    count: 1
                },
                IdRange {
                    inside: 1,
                    outside: 1,
                    count: 65536
                }
            ]
        );
        assert_eq!(map_text(&outer), "0 1000 1\n1 100000 65536\n");
    }
}
