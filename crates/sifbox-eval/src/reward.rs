//! Reading the reward a verifier wrote: `verifier/reward.json` (preferred)
//! or `verifier/reward.txt` in the rollout's dir.
//!
//! The sandbox could write anything there, symlinks and FIFOs included:
//! files are opened below the rollout dir without following any symlink,
//! must be regular files, and are read up to a limit.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The largest reward file read.
const MAX_REWARD_FILE: u64 = 1 << 20;

/// What the verifier left.
#[derive(Debug, Clone, PartialEq)]
pub enum Reward {
    /// A reward, from `source` (`reward.json` or `reward.txt`); `all` is
    /// reward.json's whole content.
    Found {
        value: f64,
        source: &'static str,
        all: Option<serde_json::Value>,
    },
    /// No reward file.
    Missing,
    /// A reward file that holds no usable reward.
    Invalid(String),
}

/// Opens `rel` below `dir` without following symlinks.
fn open_beneath(dir: &OwnedFd, rel: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        rel,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
}

fn open_dir(dir: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Reads `verifier/NAME` below `rollout_dir`: None when absent, an error
/// text when it is not a small regular file.
fn read_file(dir: &OwnedFd, name: &str) -> Option<Result<String, String>> {
    let rel = format!("verifier/{name}");
    let fd = match open_beneath(dir, &rel, OFlags::RDONLY | OFlags::NONBLOCK) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return None,
        Err(e) => return Some(Err(format!("{rel}: cannot open it ({e}); a symlink?"))),
    };
    match rustix::fs::fstat(&fd) {
        Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() => {}
        Ok(_) => return Some(Err(format!("{rel} is not a regular file"))),
        Err(e) => return Some(Err(format!("{rel}: {e}"))),
    }
    let mut text = String::new();
    let read = std::fs::File::from(fd)
        .take(MAX_REWARD_FILE + 1)
        .read_to_string(&mut text);
    Some(match read {
        Ok(n) if u64::try_from(n).unwrap_or(u64::MAX) > MAX_REWARD_FILE => {
            Err(format!("{rel} is larger than 1 MiB"))
        }
        Ok(_) => Ok(text),
        Err(e) => Err(format!("{rel}: {e}")),
    })
}

/// The reward in reward.json's text: a number, or an object with a numeric
/// `reward` (else its only numeric value).
pub fn parse_json(text: &str) -> Result<(f64, serde_json::Value), String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("reward.json is not JSON: {e}"))?;
    let value = match &v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Object(m) => match m.get("reward") {
            Some(r) => r.as_f64(),
            None => {
                let nums: Vec<f64> = m.values().filter_map(serde_json::Value::as_f64).collect();
                match nums.as_slice() {
                    [one] => Some(*one),
                    _ => None,
                }
            }
        },
        _ => None,
    };
    match value {
        Some(x) if x.is_finite() => Ok((x, v)),
        _ => Err(
            "reward.json holds no reward: write a number, or an object with a numeric \"reward\""
                .into(),
        ),
    }
}

/// The reward in reward.txt's text: one number.
pub fn parse_txt(text: &str) -> Result<f64, String> {
    let t = text.trim();
    match t.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => {
            let shown: String = t.chars().take(40).collect();
            Err(format!("reward.txt does not hold a number: {shown:?}"))
        }
    }
}

/// Reads the reward the verifier left in `rollout_dir`.
pub fn read(rollout_dir: &Path) -> Reward {
    let dir = match open_dir(rollout_dir) {
        Ok(d) => d,
        Err(e) => return Reward::Invalid(format!("{}: {e}", rollout_dir.display())),
    };
    if let Some(text) = read_file(&dir, "reward.json") {
        return match text.and_then(|t| parse_json(&t)) {
            Ok((value, all)) => Reward::Found {
                value,
                source: "reward.json",
                all: Some(all),
            },
            Err(e) => Reward::Invalid(e),
        };
    }
    match read_file(&dir, "reward.txt") {
        None => Reward::Missing,
        Some(text) => match text.and_then(|t| parse_txt(&t)) {
            Ok(value) => Reward::Found {
                value,
                source: "reward.txt",
                all: None,
            },
            Err(e) => Reward::Invalid(e),
        },
    }
}

/// Removes reward files from `verifier/` (what an agent may have left
/// there before the verifier runs); returns whether there were any.
pub fn clear(rollout_dir: &Path) -> bool {
    let Ok(dir) = open_dir(rollout_dir) else {
        return false;
    };
    let Ok(verifier) = open_beneath(&dir, "verifier", OFlags::RDONLY | OFlags::DIRECTORY) else {
        return false;
    };
    let mut any = false;
    for name in ["reward.json", "reward.txt"] {
        if rustix::fs::unlinkat(&verifier, name, rustix::fs::AtFlags::empty()).is_ok() {
            any = true;
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout() -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(d.path().join("verifier")).expect("mkdir");
        d
    }

    #[test]
    fn json_is_preferred_and_txt_works() {
        let d = rollout();
        assert_eq!(read(d.path()), Reward::Missing);
        std::fs::write(d.path().join("verifier/reward.txt"), " 0.5\n").expect("write");
        assert!(
            matches!(read(d.path()), Reward::Found { value, source: "reward.txt", .. } if value == 0.5)
        );
        std::fs::write(
            d.path().join("verifier/reward.json"),
            r#"{"reward": 1, "tests": 3}"#,
        )
        .expect("write");
        match read(d.path()) {
            Reward::Found { value, source, all } => {
                assert_eq!((value, source), (1.0, "reward.json"));
                assert_eq!(all.expect("all")["tests"], 3);
            }
            other => panic!("{other:?}"),
        }
        assert!(clear(d.path()));
        assert_eq!(read(d.path()), Reward::Missing);
        assert!(!clear(d.path()));
    }

    #[test]
    fn json_shapes() {
        assert_eq!(parse_json("0.25").map(|r| r.0), Ok(0.25));
        assert_eq!(parse_json(r#"{"accuracy": 0.75}"#).map(|r| r.0), Ok(0.75));
        assert!(parse_json(r#"{"a": 1, "b": 2}"#).is_err());
        assert!(parse_json(r#"{"reward": "1"}"#).is_err());
        assert!(parse_json("[1]").is_err());
        assert!(parse_json("nope").is_err());
        assert!(parse_txt("1e999").is_err());
        assert!(parse_txt("NaN").is_err());
        assert_eq!(parse_txt("1\n"), Ok(1.0));
    }

    #[test]
    fn symlinks_and_fifos_are_not_followed() {
        let d = rollout();
        let secret = d.path().join("secret");
        std::fs::write(&secret, "0.99").expect("write");
        std::os::unix::fs::symlink(&secret, d.path().join("verifier/reward.txt")).expect("symlink");
        assert!(matches!(read(d.path()), Reward::Invalid(e) if e.contains("symlink")));
        std::fs::remove_file(d.path().join("verifier/reward.txt")).expect("rm");
        // The verifier dir itself replaced by a symlink.
        std::fs::remove_dir(d.path().join("verifier")).expect("rmdir");
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::fs::write(elsewhere.join("reward.txt"), "1").expect("write");
        std::os::unix::fs::symlink(&elsewhere, d.path().join("verifier")).expect("symlink");
        assert!(matches!(read(d.path()), Reward::Invalid(_)));
        assert!(!clear(d.path()));
        assert!(elsewhere.join("reward.txt").exists());
        // A FIFO does not block the reader.
        std::fs::remove_file(d.path().join("verifier")).expect("rm");
        std::fs::create_dir(d.path().join("verifier")).expect("mkdir");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.path().join("verifier/reward.txt"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        assert!(matches!(read(d.path()), Reward::Invalid(e) if e.contains("regular")));
    }
}
