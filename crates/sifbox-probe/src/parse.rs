//! Pure parsers for the text formats the probe reads from `/proc` and `/sys`.
//!
//! Every function here takes the file's contents and returns plain data, so it
//! can be unit tested without a sandbox.

use std::collections::BTreeMap;

/// One line of `/proc/PID/uid_map` or `gid_map`: `[inside, outside, count]`.
pub type MapEntry = [u64; 3];

/// Parse an id map file (`/proc/self/uid_map` format).
///
/// Each line holds three whitespace-separated decimal numbers. Lines that are
/// empty are skipped; a malformed line makes the whole parse fail, so the
/// caller reports the map as unreadable rather than silently partial.
pub fn parse_id_map(text: &str) -> Option<Vec<MapEntry>> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(parse_id_map_line(line)?);
    }
    Some(out)
}

/// Parse one id map line: `inside outside count`.
pub fn parse_id_map_line(line: &str) -> Option<MapEntry> {
    let mut fields = line.split_whitespace();
    let inside = fields.next()?.parse().ok()?;
    let outside = fields.next()?.parse().ok()?;
    let count = fields.next()?.parse().ok()?;
    if fields.next().is_some() {
        return None;
    }
    Some([inside, outside, count])
}

/// One mount from `/proc/PID/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Mount point, with the kernel's octal escapes decoded.
    pub target: String,
    /// Filesystem type (e.g. `overlay`, `proc`).
    pub fstype: String,
    /// Mount source, escapes decoded (e.g. `/dev/sda1`, `tmpfs`).
    pub source: String,
    /// Per-mount options (`rw,nosuid,...`).
    pub mount_options: String,
    /// Per-superblock options.
    pub super_options: String,
}

impl MountInfo {
    /// Per-mount options followed by the super options, comma-joined.
    pub fn options(&self) -> String {
        match (self.mount_options.is_empty(), self.super_options.is_empty()) {
            (_, true) => self.mount_options.clone(),
            (true, false) => self.super_options.clone(),
            (false, false) => format!("{},{}", self.mount_options, self.super_options),
        }
    }

    /// True when the per-mount options contain `ro`.
    pub fn readonly(&self) -> bool {
        self.mount_options.split(',').any(|o| o == "ro")
    }
}

/// Parse one line of `/proc/PID/mountinfo`.
///
/// Format (see proc(5)):
/// `ID PARENT MAJ:MIN ROOT TARGET MOUNT_OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTS`
pub fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let mut fields = line.split(' ');
    let _id = fields.next()?;
    let _parent = fields.next()?;
    let _dev = fields.next()?;
    let _root = fields.next()?;
    let target = unescape_octal(fields.next()?);
    let mount_options = fields.next()?.to_string();
    // Optional fields, terminated by a lone "-".
    loop {
        let f = fields.next()?;
        if f == "-" {
            break;
        }
    }
    let fstype = unescape_octal(fields.next()?);
    let source = unescape_octal(fields.next()?);
    // Super options are normally present; tolerate a missing one.
    let super_options = fields.next().unwrap_or("").to_string();
    Some(MountInfo {
        target,
        fstype,
        source,
        mount_options,
        super_options,
    })
}

/// Parse a whole mountinfo file, skipping lines that do not parse.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(parse_mountinfo_line)
        .collect()
}

/// Decode the kernel's `\NNN` octal escapes (used for space, tab, newline and
/// backslash in mount paths).
pub fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(b) = u8::try_from(value) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse a NUL-separated `KEY=VALUE` list (`/proc/PID/environ`).
///
/// An entry without `=` maps to an empty value. When a key repeats, the first
/// occurrence wins (as with `getenv`). Invalid UTF-8 is replaced lossily.
pub fn parse_environ(data: &[u8]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in data.split(|b| *b == 0) {
        if entry.is_empty() {
            continue;
        }
        let entry = String::from_utf8_lossy(entry);
        let (key, value) = match entry.split_once('=') {
            Some((k, v)) => (k, v),
            None => (entry.as_ref(), ""),
        };
        out.entry(key.to_string())
            .or_insert_with(|| value.to_string());
    }
    out
}

/// Parse a NUL-separated argument list (`/proc/PID/cmdline`).
///
/// The trailing NUL does not produce an empty final argument, but empty
/// arguments in the middle are kept.
pub fn parse_cmdline(data: &[u8]) -> Vec<String> {
    let data = data.strip_suffix(&[0]).unwrap_or(data);
    if data.is_empty() {
        return Vec::new();
    }
    data.split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Interface names from `/proc/net/dev` (two header lines, then `NAME: stats`).
pub fn parse_net_dev(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let (name, _) = line.split_once(':')?;
            let name = name.trim();
            if name.is_empty() || name.contains('|') || name.contains(' ') {
                None
            } else {
                Some(name.to_string())
            }
        })
        .collect()
}

/// Whether `IFF_UP` (0x1) is set in a `/sys/class/net/NAME/flags` value
/// (`0x1003\n`).
pub fn parse_iface_up(text: &str) -> Option<bool> {
    let t = text.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    let flags = u64::from_str_radix(hex, 16).ok()?;
    Some(flags & 0x1 != 0)
}

/// The value of a `Key:\tvalue` line in `/proc/PID/status`.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == key).then(|| v.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_map_single_and_multi() {
        assert_eq!(
            parse_id_map("         0       1000          1\n"),
            Some(vec![[0, 1000, 1]])
        );
        assert_eq!(
            parse_id_map("0 1000 1\n1 100000 65536\n"),
            Some(vec![[0, 1000, 1], [1, 100_000, 65536]])
        );
        assert_eq!(
            parse_id_map("         0          0 4294967295\n"),
            Some(vec![[0, 0, 4_294_967_295]])
        );
        assert_eq!(parse_id_map(""), Some(vec![]));
    }

    #[test]
    fn id_map_malformed() {
        assert_eq!(parse_id_map_line("0 1000"), None);
        assert_eq!(parse_id_map_line("0 1000 x"), None);
        assert_eq!(parse_id_map_line("0 1000 1 4"), None);
        assert_eq!(parse_id_map("0 0 1\ngarbage\n"), None);
    }

    #[test]
    fn mountinfo_basic() {
        let line = "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue";
        let m = parse_mountinfo_line(line);
        assert_eq!(
            m,
            Some(MountInfo {
                target: "/mnt2".into(),
                fstype: "ext3".into(),
                source: "/dev/root".into(),
                mount_options: "rw,noatime".into(),
                super_options: "rw,errors=continue".into(),
            })
        );
        let m = m.unwrap_or_else(|| panic!("parsed above"));
        assert_eq!(m.options(), "rw,noatime,rw,errors=continue");
        assert!(!m.readonly());
    }

    #[test]
    fn mountinfo_readonly_no_optional_fields() {
        let line = "25 30 0:23 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs rw";
        let m = parse_mountinfo_line(line).unwrap_or_else(|| panic!("should parse"));
        assert_eq!(m.target, "/sys");
        assert_eq!(m.fstype, "sysfs");
        assert!(m.readonly());
        // "ro" only in super options does not count, and "rootcontext" is not "ro".
        let line = "1 2 0:1 / /x rw,rootcontext=y shared:2 master:3 - tmpfs tmpfs ro";
        let m = parse_mountinfo_line(line).unwrap_or_else(|| panic!("should parse"));
        assert!(!m.readonly());
        assert_eq!(m.options(), "rw,rootcontext=y,ro");
    }

    #[test]
    fn mountinfo_escapes_and_garbage() {
        let line = r"40 1 0:5 / /my\040dir\011x rw - tmpfs none\134x rw,size=10k";
        let m = parse_mountinfo_line(line).unwrap_or_else(|| panic!("should parse"));
        assert_eq!(m.target, "/my dir\tx");
        assert_eq!(m.source, r"none\x");
        assert_eq!(parse_mountinfo_line("1 2 3"), None);
        assert_eq!(parse_mountinfo_line("1 2 0:1 / /x rw shared:1"), None);
        let all = parse_mountinfo(
            "bad line\n25 30 0:23 / /sys rw - sysfs sysfs rw\n\n26 30 0:24 / /proc rw - proc proc rw\n",
        );
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].target, "/proc");
    }

    #[test]
    fn unescape_edges() {
        assert_eq!(unescape_octal(r"a\040"), "a ");
        assert_eq!(unescape_octal(r"a\04"), r"a\04");
        assert_eq!(unescape_octal(r"a\"), r"a\");
        assert_eq!(unescape_octal(r"\999"), r"\999");
        assert_eq!(unescape_octal(r"\777"), r"\777");
        assert_eq!(unescape_octal(r"\134\134"), r"\\");
    }

    #[test]
    fn environ_parsing() {
        let env =
            parse_environ(b"PATH=/bin:/usr/bin\0HOME=/root\0EMPTY=\0EQ=a=b\0NOEQ\0HOME=/dup\0");
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin:/usr/bin"));
        assert_eq!(env.get("HOME").map(String::as_str), Some("/root"));
        assert_eq!(env.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(env.get("EQ").map(String::as_str), Some("a=b"));
        assert_eq!(env.get("NOEQ").map(String::as_str), Some(""));
        assert_eq!(env.len(), 5);
        assert!(parse_environ(b"").is_empty());
        assert!(parse_environ(b"\0\0").is_empty());
        let env = parse_environ(b"BAD=\xff\0");
        assert_eq!(env.get("BAD").map(String::as_str), Some("\u{fffd}"));
    }

    #[test]
    fn cmdline_parsing() {
        assert_eq!(
            parse_cmdline(b"/bin/sh\0-c\0echo hi\0"),
            vec!["/bin/sh", "-c", "echo hi"]
        );
        assert_eq!(parse_cmdline(b"a\0\0b\0"), vec!["a", "", "b"]);
        assert_eq!(parse_cmdline(b"noterm"), vec!["noterm"]);
        assert!(parse_cmdline(b"").is_empty());
    }

    #[test]
    fn net_dev_parsing() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
                    face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
                    lo:  123 4 0 0 0 0 0 0 123 4 0 0 0 0 0 0\n  \
                    eth0:1 2 0 0 0 0 0 0 1 2 0 0 0 0 0 0\n";
        assert_eq!(parse_net_dev(text), vec!["lo", "eth0"]);
        assert!(parse_net_dev("").is_empty());
    }

    #[test]
    fn iface_flags() {
        assert_eq!(parse_iface_up("0x1003\n"), Some(true));
        assert_eq!(parse_iface_up("0x1002\n"), Some(false));
        assert_eq!(parse_iface_up("9"), Some(true));
        assert_eq!(parse_iface_up("zz"), None);
    }

    #[test]
    fn status_lookup() {
        let s = "Name:\tprobe\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(status_field(s, "CapEff"), Some("000001ffffffffff"));
        assert_eq!(status_field(s, "Cap"), None);
    }
}
