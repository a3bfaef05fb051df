//! `RUN --mount=...` specs: the mount types and sharing modes, and the
//! parse of a spec's comma-separated fields with Docker's defaults.

use serde::Serialize;

/// `RUN --mount` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MountType {
    /// `bind` (the default): a directory of the context or of `from`.
    Bind,
    /// `cache`: a persistent cache directory.
    Cache,
    /// `tmpfs`.
    Tmpfs,
    /// `secret`: a `--secret` file.
    Secret,
    /// `ssh`: an agent socket.
    Ssh,
}

/// `RUN --mount` sharing mode for caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Sharing {
    /// `shared` (the default).
    Shared,
    /// `private`: a new cache directory when one is in use.
    Private,
    /// `locked`: wait for the other user.
    Locked,
}

/// One `RUN --mount=...`. String fields are raw until
/// [`Mount::parse`] is called with an environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// The flag value as written.
    pub spec: String,
    /// `type=`.
    pub kind: MountType,
    /// `target=` / `dst=` / `destination=`.
    pub target: Option<String>,
    /// `source=` / `src=`.
    pub source: Option<String>,
    /// `from=`: a stage or an image.
    pub from: Option<String>,
    /// `id=`.
    pub id: Option<String>,
    /// `sharing=` (cache).
    pub sharing: Sharing,
    /// `mode=` in octal.
    pub mode: Option<u32>,
    /// `uid=`.
    pub uid: Option<u32>,
    /// `gid=`.
    pub gid: Option<u32>,
    /// `required` (secret, ssh).
    pub required: bool,
    /// `size=` in bytes (tmpfs).
    pub size: Option<u64>,
    /// Read-only: the default for bind, `ro`/`readonly` for the others;
    /// `rw`/`readwrite` clears it.
    pub readonly: bool,
    /// `env=` (secret): expose the secret as this variable.
    pub env: Option<String>,
}

impl Mount {
    /// The mount point, with Docker's defaults: `/run/secrets/ID` for a
    /// secret, `/run/buildkit/ssh_agent.0` for ssh.
    pub fn effective_target(&self) -> Option<String> {
        match (&self.target, self.kind) {
            (Some(t), _) => Some(t.clone()),
            (None, MountType::Secret) => self.id.as_ref().map(|id| format!("/run/secrets/{id}")),
            (None, MountType::Ssh) => Some("/run/buildkit/ssh_agent.0".to_owned()),
            (None, _) => None,
        }
    }

    /// The cache or secret id, with Docker's defaults: a cache's id is its
    /// target; a secret's id is the base name of its target.
    pub fn effective_id(&self) -> Option<String> {
        if let Some(id) = &self.id {
            return Some(id.clone());
        }
        match self.kind {
            MountType::Cache => self.target.clone(),
            MountType::Secret => self
                .target
                .as_deref()
                .and_then(|t| t.rsplit('/').find(|p| !p.is_empty()))
                .map(str::to_owned),
            MountType::Ssh => Some("default".to_owned()),
            _ => None,
        }
    }

    /// The mode, with Docker's defaults: 0755 for a cache directory, 0400
    /// for a secret file, 0600 for an ssh socket.
    pub fn effective_mode(&self) -> Option<u32> {
        self.mode.or(match self.kind {
            MountType::Cache => Some(0o755),
            MountType::Secret => Some(0o400),
            MountType::Ssh => Some(0o600),
            _ => None,
        })
    }

    /// Parses a `--mount` value, expanding each value with `expand`
    /// (pass `&|s| Ok(s.to_owned())` for none).
    pub fn parse(
        spec: &str,
        expand: &dyn Fn(&str) -> std::result::Result<String, String>,
    ) -> std::result::Result<Mount, String> {
        let fields = split_csv(spec)?;
        let mut kind = MountType::Bind;
        let mut rest = Vec::new();
        for f in fields {
            let (k, v) = match f.split_once('=') {
                Some((k, v)) => (k.trim().to_ascii_lowercase(), Some(v.to_owned())),
                None => (f.trim().to_ascii_lowercase(), None),
            };
            if k == "type" {
                let v = v.ok_or("type needs a value (bind, cache, tmpfs, secret, ssh)")?;
                kind = match v.to_ascii_lowercase().as_str() {
                    "bind" => MountType::Bind,
                    "cache" => MountType::Cache,
                    "tmpfs" => MountType::Tmpfs,
                    "secret" => MountType::Secret,
                    "ssh" => MountType::Ssh,
                    other => {
                        return Err(format!(
                            "unsupported mount type {other:?} (bind, cache, tmpfs, secret, ssh)"
                        ))
                    }
                };
            } else {
                rest.push((k, v));
            }
        }
        let mut m = Mount {
            spec: spec.to_owned(),
            kind,
            target: None,
            source: None,
            from: None,
            id: None,
            sharing: Sharing::Shared,
            mode: None,
            uid: None,
            gid: None,
            required: false,
            size: None,
            readonly: kind == MountType::Bind,
            env: None,
        };
        for (k, v) in rest {
            let boolean = |v: &Option<String>| -> std::result::Result<bool, String> {
                match v.as_deref().map(str::to_ascii_lowercase).as_deref() {
                    None | Some("true") => Ok(true),
                    Some("false") => Ok(false),
                    Some(other) => Err(format!("{k}: expected true or false, got {other:?}")),
                }
            };
            if matches!(k.as_str(), "ro" | "readonly") {
                m.readonly = boolean(&v)?;
                continue;
            }
            if matches!(k.as_str(), "rw" | "readwrite") {
                m.readonly = !boolean(&v)?;
                continue;
            }
            if k == "required" {
                m.required = boolean(&v)?;
                continue;
            }
            let Some(raw) = v else {
                return Err(format!("mount option {k} needs a value ({k}=...)"));
            };
            let val = expand(&raw)?;
            match k.as_str() {
                "target" | "dst" | "destination" => m.target = Some(val),
                "source" | "src" => m.source = Some(val),
                "from" => m.from = Some(val),
                "id" => m.id = Some(val),
                "env" => m.env = Some(val),
                "sharing" => {
                    m.sharing = match val.as_str() {
                        "shared" => Sharing::Shared,
                        "private" => Sharing::Private,
                        "locked" => Sharing::Locked,
                        other => {
                            return Err(format!(
                                "unsupported sharing value {other:?} (shared, private, locked)"
                            ))
                        }
                    }
                }
                "mode" => {
                    m.mode = Some(
                        u32::from_str_radix(&val, 8)
                            .map_err(|_| format!("mode {val:?} is not an octal number"))?,
                    )
                }
                "uid" => {
                    m.uid = Some(
                        val.parse()
                            .map_err(|_| format!("uid {val:?} is not a number"))?,
                    )
                }
                "gid" => {
                    m.gid = Some(
                        val.parse()
                            .map_err(|_| format!("gid {val:?} is not a number"))?,
                    )
                }
                "size" => m.size = Some(parse_size(&val)?),
                other => return Err(format!("unexpected mount option {other:?}")),
            }
        }
        if m.target.is_none() && !matches!(m.kind, MountType::Secret | MountType::Ssh) {
            return Err("mount needs a target (target=/path)".to_owned());
        }
        if m.kind == MountType::Secret && m.id.is_none() && m.target.is_none() {
            return Err("secret mount needs id= or target=".to_owned());
        }
        Ok(m)
    }
}

/// Sizes as in `size=64m`: bytes, or with a k/m/g/t suffix (powers of 1024,
/// an optional trailing `b`/`ib`).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let t = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'm')) => (&t[..i], 1 << 20),
        Some((i, 'g')) => (&t[..i], 1 << 30),
        Some((i, 't')) => (&t[..i], 1 << 40),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("size {s:?} is not a size (e.g. 64m)"))
}

/// Splits `a=1,"b=x,y",c` into fields (CSV: double quotes group, `""` is a
/// quote inside quotes).
fn split_csv(s: &str) -> std::result::Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    cur.push('"');
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' {
            quoted = true;
        } else if c == ',' {
            fields.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if quoted {
        return Err(format!("unclosed quote in {s:?}"));
    }
    fields.push(cur);
    Ok(fields
        .into_iter()
        .filter(|f| !f.trim().is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_defaults() {
        let m = |spec: &str| Mount::parse(spec, &|s| Ok(s.to_owned())).expect(spec);
        let s = m("type=secret,id=tok");
        assert_eq!(s.effective_target().as_deref(), Some("/run/secrets/tok"));
        assert_eq!(s.effective_mode(), Some(0o400));
        let s = m("type=secret,target=/etc/creds/aws");
        assert_eq!(s.effective_id().as_deref(), Some("aws"));
        let c = m("type=cache,target=/var/cache/apt");
        assert_eq!(c.effective_id().as_deref(), Some("/var/cache/apt"));
        assert_eq!(c.effective_mode(), Some(0o755));
        let c = m("type=cache,target=/c,mode=0777,id=x");
        assert_eq!(
            (c.effective_id().as_deref(), c.effective_mode()),
            (Some("x"), Some(0o777))
        );
        let h = m("type=ssh");
        assert_eq!(
            h.effective_target().as_deref(),
            Some("/run/buildkit/ssh_agent.0")
        );
        let b = m("target=/src");
        assert_eq!((b.kind, b.effective_mode()), (MountType::Bind, None));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999t").is_err());
    }
}
