//! Subordinate id ranges and the newuidmap/newgidmap helpers (`--userns
//! full`).

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::io::Errno;

use super::{find_executable, io_text, Check};

/// How an id-map helper gets its privilege.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HelperPrivilege {
    Setuid,
    FileCaps,
    /// Neither setuid nor file capabilities: it cannot map ranges for a normal user.
    None,
    /// Capabilities could not be read (no xattr support); assume it works.
    Unknown,
}

fn helper_privilege(path: &Path, meta: &fs::Metadata) -> HelperPrivilege {
    if meta.mode() & 0o4000 != 0 && meta.uid() == 0 {
        return HelperPrivilege::Setuid;
    }
    let mut buf = [0u8; 64];
    match rustix::fs::getxattr(path, "security.capability", &mut buf[..]) {
        Ok(n) if n > 0 => HelperPrivilege::FileCaps,
        Ok(_) | Err(Errno::NODATA) => HelperPrivilege::None,
        Err(_) => HelperPrivilege::Unknown,
    }
}

pub(super) fn check_subordinate_ids() -> Check {
    const NAME: &str = "subordinate ids";
    let euid = rustix::process::geteuid().as_raw();
    let name = fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|t| crate::idmap::passwd_name(&t, euid));
    let who = match &name {
        Some(n) => format!("{n} (uid {euid})"),
        None => format!("uid {euid} (not in /etc/passwd)"),
    };
    let user_arg = name.clone().unwrap_or_else(|| euid.to_string());

    let mut missing = Vec::new();
    let mut found = Vec::new();
    for (file, label) in [("/etc/subuid", "subuid"), ("/etc/subgid", "subgid")] {
        match fs::read_to_string(file) {
            Ok(text) => {
                let ranges = crate::idmap::subranges(&text, name.as_deref(), euid);
                if ranges.is_empty() {
                    missing.push(format!("no range in {file}"));
                } else {
                    let list: Vec<String> = ranges.iter().map(ToString::to_string).collect();
                    found.push(format!("{label} {}", list.join(", ")));
                }
            }
            Err(e) => missing.push(format!("{file}: {}", io_text(&e))),
        }
    }

    let mut helpers = Vec::new();
    let mut helper_problem = Vec::new();
    for tool in ["newuidmap", "newgidmap"] {
        match find_executable(tool, &[Path::new("/usr/bin")]) {
            Some((path, meta)) => {
                let how = match helper_privilege(&path, &meta) {
                    HelperPrivilege::Setuid => "setuid",
                    HelperPrivilege::FileCaps => "file capabilities",
                    HelperPrivilege::Unknown => "present",
                    HelperPrivilege::None => {
                        helper_problem.push(format!(
                            "{} is neither setuid root nor has file capabilities",
                            path.display()
                        ));
                        "not setuid"
                    }
                };
                helpers.push(format!("{tool} {} ({how})", path.display()));
            }
            None => helper_problem.push(format!("{tool} not found on PATH or in /usr/bin")),
        }
    }

    let mut parts = vec![who];
    parts.extend(found);
    parts.extend(missing.iter().cloned());
    parts.extend(helpers);
    parts.extend(helper_problem.iter().cloned());

    if euid == 0 {
        let detail = if missing.is_empty() {
            format!("root can write any id map; {}", parts.join("; "))
        } else {
            "root can write any id map".to_owned()
        };
        return Check::ok(NAME, detail);
    }
    if missing.is_empty() && helper_problem.is_empty() {
        return Check::ok(NAME, parts.join("; "));
    }
    parts.push(
        "sifbox does without: it maps your own id alone (`sifbox run --userns single`, what \
         `--userns auto` picks here), so the image's other owners show as nobody and \
         `sifbox run --userns full` is refused"
            .to_owned(),
    );
    let mut fix = String::new();
    if !missing.is_empty() {
        let _ = writeln!(
            fix,
            "as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user_arg}"
        );
    }
    if !helper_problem.is_empty() {
        fix.push_str(
            "install the uidmap package (newuidmap/newgidmap, setuid root): \
             apt-get install uidmap / dnf install shadow-utils",
        );
    }
    Check::optional(NAME, parts.join("; "), fix)
}
