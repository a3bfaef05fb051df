//! Reading the reward a verifier wrote: `verifier/reward.json` (preferred)
//! or `verifier/reward.txt` in the rollout's dir.
//!
//! The verifier could write anything there, symlinks and FIFOs included:
//! files are opened below an fd of `verifier/` opened before the sandbox
//! started (never by path afterwards) without following any symlink, must be regular files owned by one of the sandbox's ids (a
//! file of another host user was not written by the verifier), and are
//! read up to a limit.

use std::io::Read;
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, OFlags};
use sifbox_engine::spec::IdMapping;
use sifbox_sys::beneath;

/// The reward files, in the order they are looked for.
const FILES: [&str; 2] = ["reward.json", "reward.txt"];

/// The largest reward file read.
const MAX_REWARD_FILE: u64 = 1 << 20;

/// What the verifier left.
#[derive(Debug, Clone, PartialEq)]
pub enum Reward {
    /// A reward, from `source` (`reward.json` or `reward.txt`); `all` is
    /// reward.json's whole content. `value` is the headline reward: none
    /// for a reward.json of several rewards without a `reward` key.
    Found {
        value: Option<f64>,
        source: &'static str,
        all: Option<serde_json::Value>,
    },
    /// No reward file.
    Missing,
    /// A reward file that holds no usable reward.
    Invalid(String),
}

/// Whether host uid `uid` is one of the sandbox's (the outside side of its
/// uid map).
pub fn uid_mapped(uid: u32, ids: &IdMapping) -> bool {
    ids.uid
        .iter()
        .any(|r| uid >= r.outside && u64::from(uid - r.outside) < u64::from(r.count))
}

/// The sandbox's uid map as the host sees it: `0→1001, 1-65536→100000-165535`.
fn describe(ids: &IdMapping) -> String {
    ids.uid
        .iter()
        .map(|r| {
            let last = |base: u32| u64::from(base) + u64::from(r.count.saturating_sub(1));
            if r.count <= 1 {
                format!("{}→{}", r.inside, r.outside)
            } else {
                format!(
                    "{}-{}→{}-{}",
                    r.inside,
                    last(r.inside),
                    r.outside,
                    last(r.outside)
                )
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads `NAME` below the verifier dir `dir`: None when absent, an error
/// text when it is not a small regular file of the sandbox's ids.
fn read_file(dir: BorrowedFd<'_>, name: &str, ids: &IdMapping) -> Option<Result<String, String>> {
    let rel = format!("verifier/{name}");
    let fd = match beneath::open_beneath(
        dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW,
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return None,
        Err(e) => return Some(Err(format!("{rel}: cannot open it ({e}); a symlink?"))),
    };
    match rustix::fs::fstat(&fd) {
        Ok(st) if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() => {
            return Some(Err(format!("{rel} is not a regular file")))
        }
        Ok(st) if !uid_mapped(st.st_uid, ids) => {
            return Some(Err(format!(
                "{rel} belongs to host uid {}, which is none of the sandbox's ids ({}): a file that another user of the host put there is not taken as the reward",
                st.st_uid,
                describe(ids)
            )))
        }
        Ok(_) => {}
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

/// The rewards in reward.json's text, by Harbor's rule: a flat object
/// whose values are all finite numbers, under any keys (a bare number is
/// also taken, as one reward). The headline is `reward` when it is there,
/// else the only value; an object of several rewards without `reward` has
/// none (Harbor then sums up each key on its own).
pub fn parse_json(text: &str) -> Result<(Option<f64>, serde_json::Value), String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("reward.json is not JSON: {e}"))?;
    let finite = |x: &serde_json::Value| x.as_f64().filter(|f| f.is_finite());
    let value = match &v {
        serde_json::Value::Number(_) => Some(finite(&v).ok_or_else(|| {
            "reward.json holds a number that is not finite".to_string()
        })?),
        serde_json::Value::Object(m) if m.is_empty() => {
            return Err(
                "reward.json is an empty object: write {\"reward\": NUMBER} (more keys of numbers may follow)"
                    .into(),
            )
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if finite(x).is_none() {
                    let shown: String = x.to_string().chars().take(40).collect();
                    return Err(format!(
                        "reward.json's {k:?} is {shown}, not a finite number: every value of reward.json must be one (Harbor's rule)"
                    ));
                }
            }
            match (m.get("reward"), m.len()) {
                (Some(r), _) => finite(r),
                (None, 1) => m.values().next().and_then(finite),
                (None, _) => None,
            }
        }
        _ => {
            return Err(
                "reward.json holds no reward: write an object of numbers, e.g. {\"reward\": 1}".into(),
            )
        }
    };
    Ok((value, v))
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

/// Reads the reward the verifier left in its dir `verifier` (an fd of the
/// rollout's `verifier/`, opened before the sandbox started); `ids`: the
/// sandbox's id mapping.
pub fn read(verifier: BorrowedFd<'_>, ids: &IdMapping) -> Reward {
    let dir = verifier;
    if let Some(text) = read_file(dir, FILES[0], ids) {
        return match text.and_then(|t| parse_json(&t)) {
            Ok((value, all)) => Reward::Found {
                value,
                source: "reward.json",
                all: Some(all),
            },
            Err(e) => Reward::Invalid(e),
        };
    }
    match read_file(dir, FILES[1], ids) {
        None => Reward::Missing,
        Some(text) => match text.and_then(|t| parse_txt(&t)) {
            Ok(value) => Reward::Found {
                value: Some(value),
                source: "reward.txt",
                all: None,
            },
            Err(e) => Reward::Invalid(e),
        },
    }
}

/// Whether the verifier dir `verifier` (an fd of it) holds a reward file
/// (of any kind, not followed): what an agent may leave there.
pub fn present(verifier: BorrowedFd<'_>) -> bool {
    FILES
        .iter()
        .any(|f| rustix::fs::statat(verifier, *f, AtFlags::SYMLINK_NOFOLLOW).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::Mode;
    use sifbox_engine::spec::{IdRange, UsernsMode};
    use std::os::fd::AsFd;
    use std::path::Path;

    fn rollout() -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(d.path().join("verifier")).expect("mkdir");
        d
    }

    fn mapping(outside: u32, count: u32) -> IdMapping {
        let r = vec![IdRange {
            inside: 0,
            outside,
            count,
        }];
        IdMapping {
            mode: UsernsMode::Single,
            uid: r.clone(),
            gid: r,
            external: false,
        }
    }

    /// A mapping whose root is the caller, as in every sandbox.
    fn mine() -> IdMapping {
        mapping(rustix::process::geteuid().as_raw(), 1)
    }

    fn read_in(dir: &Path, ids: &IdMapping) -> Reward {
        let fd = crate::rollout_dir::open_dir_nofollow(&dir.join("verifier")).expect("open");
        read(fd.as_fd(), ids)
    }

    fn read_at(dir: &Path) -> Reward {
        read_in(dir, &mine())
    }

    fn present_at(dir: &Path) -> bool {
        let fd = crate::rollout_dir::open_dir_nofollow(&dir.join("verifier")).expect("open");
        present(fd.as_fd())
    }

    #[test]
    fn json_is_preferred_and_txt_works() {
        let d = rollout();
        assert_eq!(read_at(d.path()), Reward::Missing);
        assert!(!present_at(d.path()));
        std::fs::write(d.path().join("verifier/reward.txt"), " 0.5\n").expect("write");
        assert!(
            matches!(read_at(d.path()), Reward::Found { value, source: "reward.txt", .. } if value == Some(0.5))
        );
        assert!(present_at(d.path()));
        std::fs::write(
            d.path().join("verifier/reward.json"),
            r#"{"reward": 1, "tests": 3}"#,
        )
        .expect("write");
        match read_at(d.path()) {
            Reward::Found { value, source, all } => {
                assert_eq!((value, source), (Some(1.0), "reward.json"));
                assert_eq!(all.expect("all")["tests"], 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn json_shapes() {
        let headline = |t: &str| parse_json(t).map(|r| r.0);
        assert_eq!(headline("0.25"), Ok(Some(0.25)));
        assert_eq!(headline(r#"{"accuracy": 0.75}"#), Ok(Some(0.75)));
        // Harbor's rule: any keys, every value a number; `reward` leads.
        assert_eq!(headline(r#"{"a": 1, "b": 2}"#), Ok(None));
        assert_eq!(
            headline(r#"{"a": 1, "reward": 0.5, "b": -2}"#),
            Ok(Some(0.5))
        );
        let (_, all) = parse_json(r#"{"pass": 3, "fail": 1.5}"#).expect("flat");
        assert_eq!(all["fail"], 1.5);
        for bad in [
            r#"{"reward": "1"}"#,
            r#"{"reward": 1, "detail": "x"}"#,
            r#"{"reward": 1, "nested": {"a": 1}}"#,
            r#"{"reward": null}"#,
            r#"{"reward": true}"#,
            r#"{"reward": 1e999}"#,
            "{}",
            "[1]",
            "nope",
        ] {
            let e = parse_json(bad).expect_err(bad);
            assert!(e.contains("reward.json"), "{bad}: {e}");
        }
        assert!(parse_json(r#"{"reward": 1, "detail": "x"}"#)
            .expect_err("str")
            .contains("\"detail\""));
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
        assert!(matches!(read_at(d.path()), Reward::Invalid(e) if e.contains("symlink")));
        assert!(present_at(d.path()), "a planted symlink counts");
        std::fs::remove_file(d.path().join("verifier/reward.txt")).expect("rm");
        // The verifier dir itself replaced by a symlink after its fd was
        // opened (as eval opens it, before the sandbox starts): the reward
        // is read from the dir the fd names, never from where the link
        // points.
        let held = crate::rollout_dir::open_dir_nofollow(&d.path().join("verifier")).expect("open");
        std::fs::remove_dir(d.path().join("verifier")).expect("rmdir");
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::fs::write(elsewhere.join("reward.txt"), "1").expect("write");
        std::os::unix::fs::symlink(&elsewhere, d.path().join("verifier")).expect("symlink");
        assert_eq!(read(held.as_fd(), &mine()), Reward::Missing);
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
        assert!(matches!(read_at(d.path()), Reward::Invalid(e) if e.contains("regular")));
    }

    #[test]
    fn a_reward_file_of_a_user_outside_the_mapping_is_refused() {
        let d = rollout();
        std::fs::write(d.path().join("verifier/reward.txt"), "1\n").expect("write");
        let me = rustix::process::geteuid().as_raw();
        // The file is the caller's; a mapping without the caller stands for
        // a sandbox whose ids do not include the file's owner (as a file
        // that another local user planted would be).
        let others = mapping(me.wrapping_add(1000), 65536);
        match read_in(d.path(), &others) {
            Reward::Invalid(e) => {
                assert!(
                    e.contains(&format!("host uid {me}"))
                        && e.contains("none of the sandbox's ids"),
                    "{e}"
                );
                assert!(
                    e.contains(&format!("0-65535→{}-", me.wrapping_add(1000))),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_file(d.path().join("verifier/reward.txt")).expect("rm");
        std::fs::write(d.path().join("verifier/reward.json"), "0.5").expect("write");
        assert!(
            matches!(read_in(d.path(), &others), Reward::Invalid(e) if e.contains("reward.json belongs"))
        );
        // The same file in a sandbox whose ids hold its owner: taken.
        assert!(matches!(read_at(d.path()), Reward::Found { value, .. } if value == Some(0.5)));
        let full = IdMapping {
            uid: vec![
                IdRange {
                    inside: 0,
                    outside: me.wrapping_add(7),
                    count: 1,
                },
                IdRange {
                    inside: 1,
                    outside: me,
                    count: 3,
                },
            ],
            ..mine()
        };
        assert!(matches!(read_in(d.path(), &full), Reward::Found { .. }));
    }

    #[test]
    fn uid_mapping_bounds() {
        let ids = mapping(100_000, 65536);
        assert!(!uid_mapped(99_999, &ids));
        assert!(uid_mapped(100_000, &ids));
        assert!(uid_mapped(165_535, &ids));
        assert!(!uid_mapped(165_536, &ids));
        let edge = mapping(u32::MAX, 1);
        assert!(uid_mapped(u32::MAX, &edge));
        assert!(!uid_mapped(0, &edge));
    }

    proptest::proptest! {
        /// Any text: a reward or an error, never a panic; a headline is
        /// always finite, and an object's every value is a number.
        #[test]
        fn any_reward_json_never_panics(s in "\\PC{0,200}") {
            if let Ok((value, all)) = parse_json(&s) {
                proptest::prop_assert!(value.is_none_or(f64::is_finite));
                if let Some(m) = all.as_object() {
                    proptest::prop_assert!(m.values().all(|v| v.as_f64().is_some()));
                }
            }
        }

        /// Objects of numbers under any keys: accepted, `reward` leading.
        #[test]
        fn flat_objects_of_numbers_are_rewards(
            keys in proptest::collection::btree_map("[a-z_]{1,8}", -1e6f64..1e6, 1..6),
        ) {
            let text = serde_json::to_string(&keys).expect("json");
            let (value, _) = parse_json(&text).expect("accepted");
            let want = keys.get("reward").copied().or_else(|| {
                (keys.len() == 1).then(|| *keys.values().next().expect("one"))
            });
            // JSON's text of a float may be off in its last bit.
            let close = match (value, want) {
                (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                (a, b) => a == b,
            };
            proptest::prop_assert!(close, "{:?} != {:?}", value, want);
        }
    }
}
