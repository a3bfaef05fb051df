//! Image metadata (env, workdir, user, entrypoint, cmd, labels) and its
//! Apptainer layout inside the image (`/.singularity.d`).
//!
//! sifbox keeps the metadata twice: as a JSON object in the SIF (what sifbox
//! reads back) and as Apptainer's files inside the root file system, so that
//! Apptainer running a sifbox image sees the same environment, command and
//! labels.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};

/// Name of the SIF JSON object holding [`ImageMeta`].
pub const SIF_OBJECT_NAME: &str = "sifbox-image-meta.json";

/// What an image says about how to run it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageMeta {
    /// `KEY=VALUE`, in order.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `EXPOSE`d ports (`80/tcp`), recorded only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
    /// `VOLUME`s, recorded only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    /// `STOPSIGNAL`, recorded only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// `HEALTHCHECK`, as Docker's config has it (`Test`, `Interval`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthcheck: Option<serde_json::Value>,
    /// `ONBUILD` triggers, run when a build starts `FROM` this image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub onbuild: Vec<String>,
    /// `SHELL`, the shell of shell-form commands in builds from this image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<Vec<String>>,
}

impl ImageMeta {
    /// The environment as pairs (entries without `=` are skipped).
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        self.env
            .iter()
            .filter_map(|e| {
                e.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect()
    }

    /// The command a container runs when given `args` (Docker's rules):
    /// entrypoint + (args, or cmd when no args); else args, or cmd.
    pub fn command(&self, args: &[String]) -> Vec<String> {
        let rest: Vec<String> = if args.is_empty() {
            self.cmd.clone().unwrap_or_default()
        } else {
            args.to_vec()
        };
        match &self.entrypoint {
            Some(ep) if !ep.is_empty() => ep.iter().cloned().chain(rest).collect(),
            _ => rest,
        }
    }
}

/// Quotes `s` for a POSIX shell (single quotes).
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Escapes `s` for the inside of a double-quoted shell string.
fn sh_double(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if matches!(c, '"' | '\\' | '$' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The text of `10-docker2singularity.sh` for `meta`: one line per
/// variable that keeps a value already set at run time, except PATH, which
/// is set unconditionally (as Apptainer writes it).
pub fn docker2singularity_env(meta: &ImageMeta) -> String {
    let mut out = String::from("#!/bin/sh\n");
    for (k, v) in meta.env_pairs() {
        if !valid_name(&k) {
            continue;
        }
        let v = sh_double(&v);
        if k == "PATH" {
            let _ = writeln!(out, "export PATH=\"{v}\"");
        } else {
            let _ = writeln!(out, "export {k}=\"${{{k}:-\"{v}\"}}\"");
        }
    }
    out
}

fn valid_name(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The text of the runscript: runs entrypoint/cmd with Docker's rules.
pub fn runscript(meta: &ImageMeta) -> String {
    let join = |v: &Option<Vec<String>>| {
        v.as_ref()
            .map(|v| v.iter().map(|a| sh_quote(a)).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    let ep = join(&meta.entrypoint);
    let cmd = join(&meta.cmd);
    format!(
        "#!/bin/sh\n\
         # Written by sifbox from the image's entrypoint and cmd.\n\
         if [ $# -eq 0 ]; then set -- {cmd}; fi\n\
         {run}\n",
        run = if ep.is_empty() {
            "if [ $# -eq 0 ]; then echo 'no command given and the image has none' >&2; exit 1; fi\nexec \"$@\"".to_string()
        } else {
            format!("exec {ep} \"$@\"")
        }
    )
}

/// One entry of Apptainer's layout (see [`layout`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutEntry {
    /// A directory, made with its parents unless there (`mkdir -p`).
    Dir(&'static str),
    /// An empty file, made unless an entry of that name is there.
    EmptyFileIfMissing(&'static str),
    /// A file with this text and mode, written anew.
    File {
        path: &'static str,
        text: String,
        mode: u32,
    },
}

/// Apptainer's layout for `meta`, in the order it is written: the dirs
/// Apptainer expects, empty `/etc/hosts` and `/etc/resolv.conf` where
/// missing, then the files of `/.singularity.d` (env scripts, runscript,
/// startscript, labels.json). Paths are relative to the image's root.
pub fn layout(meta: &ImageMeta) -> std::io::Result<Vec<LayoutEntry>> {
    let mut out: Vec<LayoutEntry> = [
        ".singularity.d/env",
        ".singularity.d/actions",
        ".singularity.d/libs",
        "dev",
        "proc",
        "root",
        "var/tmp",
        "tmp",
        "etc",
        "sys",
        "home",
    ]
    .into_iter()
    .map(LayoutEntry::Dir)
    .collect();
    out.push(LayoutEntry::EmptyFileIfMissing("etc/hosts"));
    out.push(LayoutEntry::EmptyFileIfMissing("etc/resolv.conf"));
    let labels = serde_json::to_string_pretty(&meta.labels).map_err(std::io::Error::other)?;
    for (path, text, mode) in [
        (
            ".singularity.d/env/01-base.sh",
            "#!/bin/sh\n# Written by sifbox.\n".to_string(),
            0o755,
        ),
        (
            ".singularity.d/env/10-docker2singularity.sh",
            docker2singularity_env(meta),
            0o755,
        ),
        (
            ".singularity.d/env/90-environment.sh",
            "#!/bin/sh\n".into(),
            0o755,
        ),
        (".singularity.d/env/99-base.sh", "#!/bin/sh\n".into(), 0o755),
        (RUNSCRIPT, runscript(meta), 0o755),
        (".singularity.d/startscript", "#!/bin/sh\n".into(), 0o755),
        (".singularity.d/labels.json", labels, 0o644),
    ] {
        out.push(LayoutEntry::File { path, text, mode });
    }
    Ok(out)
}

/// Writes Apptainer's layout ([`layout`]) into the root file system `root`.
pub fn write_layout(root: &Path, meta: &ImageMeta) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority())?;
    for entry in layout(meta)? {
        match entry {
            LayoutEntry::Dir(d) => dir.create_dir_all(d)?,
            LayoutEntry::EmptyFileIfMissing(f) => {
                if dir.symlink_metadata(f).is_err() {
                    dir.create(f)?;
                }
            }
            LayoutEntry::File { path, text, mode } => {
                let mut f = dir.create(path)?;
                f.write_all(text.as_bytes())?;
                f.set_permissions(cap_std::fs::Permissions::from_std(
                    std::fs::Permissions::from_mode(mode),
                ))?;
            }
        }
    }
    Ok(())
}

/// Where Apptainer's runscript lives in an image.
pub const RUNSCRIPT: &str = ".singularity.d/runscript";

/// Whether the tree at `root` has an Apptainer runscript (a file, or a
/// symlink, which the sandbox resolves inside its own root: the host never
/// follows it).
pub fn has_runscript(root: &Path) -> bool {
    std::fs::symlink_metadata(root.join(RUNSCRIPT))
        .is_ok_and(|m| m.is_file() || m.file_type().is_symlink())
}

/// Whether `root` carries Apptainer env scripts that a command must source.
pub fn has_env_scripts(root: &Path) -> bool {
    std::fs::read_dir(root.join(".singularity.d/env")).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".sh"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ImageMeta {
        ImageMeta {
            env: vec![
                "PATH=/opt/bin:/usr/bin".into(),
                "GREETING=hello \"world\" $HOME".into(),
                "bad name=x".into(),
            ],
            workdir: Some("/work".into()),
            user: None,
            entrypoint: Some(vec!["/bin/echo".into(), "it's".into()]),
            cmd: Some(vec!["default".into()]),
            labels: BTreeMap::from([("org.example".into(), "v1".into())]),
            ..ImageMeta::default()
        }
    }

    #[test]
    fn env_script_keeps_runtime_values_but_path() {
        let text = docker2singularity_env(&meta());
        assert!(text.contains("export PATH=\"/opt/bin:/usr/bin\"\n"));
        assert!(text.contains("export GREETING=\"${GREETING:-\"hello \\\"world\\\" \\$HOME\"}\"\n"));
        assert!(!text.contains("bad name"));
    }

    #[test]
    fn command_follows_docker_rules() {
        let m = meta();
        assert_eq!(m.command(&[]), vec!["/bin/echo", "it's", "default"]);
        assert_eq!(m.command(&["x".into()]), vec!["/bin/echo", "it's", "x"]);
        let no_ep = ImageMeta {
            entrypoint: None,
            ..meta()
        };
        assert_eq!(no_ep.command(&[]), vec!["default"]);
        assert_eq!(no_ep.command(&["ls".into()]), vec!["ls"]);
    }

    #[test]
    fn layout_and_scripts_work_in_a_shell() {
        let t = tempfile::tempdir().expect("tempdir");
        write_layout(t.path(), &meta()).expect("layout");
        assert!(has_env_scripts(t.path()));
        let labels: BTreeMap<String, String> = serde_json::from_slice(
            &std::fs::read(t.path().join(".singularity.d/labels.json")).expect("labels"),
        )
        .expect("json");
        assert_eq!(labels["org.example"], "v1");
        // The env script and the runscript mean what they say when run.
        let env = t.path().join(".singularity.d/env/10-docker2singularity.sh");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(". {}; echo \"$GREETING|$PATH\"", env.display()))
            .env("HOME", "/h")
            .output()
            .expect("sh");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello \"world\" $HOME|/opt/bin:/usr/bin\n"
        );
        let rs = t.path().join(".singularity.d/runscript");
        let out = std::process::Command::new("sh")
            .arg(&rs)
            .output()
            .expect("sh");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's default\n");
        let out = std::process::Command::new("sh")
            .arg(&rs)
            .arg("given")
            .output()
            .expect("sh");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's given\n");
    }
}
