//! The build context: finding `COPY`/`ADD` sources in it (globs,
//! `.dockerignore`), placing them under Docker's destination rules, hashing
//! what will be copied for the cache key, and writing it as a tar stream.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::{BuildError, Result};
use crate::ignore::Ignore;

/// A build context directory and its `.dockerignore`.
#[derive(Debug)]
pub struct Context {
    root: PathBuf,
    ignore: Ignore,
}

/// What one entry of a copy is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File { size: u64 },
    Dir,
    Symlink(PathBuf),
}

/// One entry to copy: where it comes from and its name under the
/// destination directory.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative path under the destination directory.
    pub name: PathBuf,
    /// The file on the host.
    pub src: PathBuf,
    pub kind: Kind,
    pub mode: u32,
    pub mtime: u64,
}

/// A planned copy: the destination directory (absolute, inside the image)
/// and the entries to unpack into it.
#[derive(Debug, Clone)]
pub struct CopyPlan {
    pub dest_dir: String,
    pub entries: Vec<Entry>,
}

/// A matched source: its path relative to the context and its metadata.
#[derive(Debug)]
struct Source {
    rel: String,
    path: PathBuf,
    meta: std::fs::Metadata,
}

impl Context {
    /// Opens `root`, reading its `.dockerignore` (if any).
    pub fn open(root: &Path) -> Result<Context> {
        let root = std::fs::canonicalize(root).map_err(|e| {
            BuildError::bad(
                format!("build context {}", root.display()),
                e.to_string(),
                "pass an existing directory as CONTEXT",
            )
        })?;
        if !root.is_dir() {
            return Err(BuildError::bad(
                format!("build context {}", root.display()),
                "not a directory",
                "pass a directory as CONTEXT",
            ));
        }
        let ignore_path = root.join(".dockerignore");
        let ignore = match std::fs::read_to_string(&ignore_path) {
            Ok(text) => Ignore::parse(&text).map_err(|e| {
                BuildError::bad(
                    ignore_path.display().to_string(),
                    e.to_string(),
                    "fix the pattern (Docker's .dockerignore syntax)",
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ignore::default(),
            Err(e) => return Err(BuildError::io(&ignore_path, e)),
        };
        Ok(Context { root, ignore })
    }

    /// This context with more exclusions (`COPY --exclude`), matched like
    /// `.dockerignore` lines and added after them.
    pub fn with_excludes(&self, patterns: &[String]) -> Result<Context> {
        let mut lines = self.ignore.patterns();
        lines.extend(patterns.iter().cloned());
        let ignore = Ignore::parse(&lines.join("\n")).map_err(|e| {
            BuildError::bad(
                format!("--exclude {patterns:?}"),
                e.to_string(),
                "give patterns in .dockerignore syntax",
            )
        })?;
        Ok(Context {
            root: self.root.clone(),
            ignore,
        })
    }

    /// The context directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn excluded(&self, rel: &str, is_dir: bool) -> bool {
        !rel.is_empty() && self.ignore.is_excluded(rel, is_dir)
    }

    /// The sources a `COPY` source pattern names: a path or a glob (Go's
    /// `filepath.Match` per component), relative to the context root,
    /// never outside it, `.dockerignore` applied.
    fn sources(&self, pattern: &str) -> Result<Vec<Source>> {
        let clean = clean_rel(pattern);
        if !has_glob(&clean) {
            if !clean.is_empty() && self.excluded_path(&clean) {
                return Ok(Vec::new());
            }
            let path = self.root.join(&clean);
            return match std::fs::symlink_metadata(&path) {
                Ok(meta) => Ok(vec![Source {
                    rel: clean,
                    path,
                    meta,
                }]),
                Err(_) => Ok(Vec::new()),
            };
        }
        // Match component by component from the root.
        let parts: Vec<&str> = clean.split('/').collect();
        let mut found = vec![String::new()];
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let mut next = Vec::new();
            for base in &found {
                let dir = self.root.join(base);
                if !has_glob(part) {
                    let rel = join_rel(base, part);
                    if std::fs::symlink_metadata(self.root.join(&rel)).is_ok() {
                        next.push(rel);
                    }
                    continue;
                }
                let Ok(rd) = std::fs::read_dir(&dir) else {
                    continue;
                };
                let mut names: Vec<String> = rd
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect();
                names.sort();
                for n in names {
                    if crate::ignore::glob_match(part, &n) {
                        let rel = join_rel(base, &n);
                        if last || self.root.join(&rel).is_dir() {
                            next.push(rel);
                        }
                    }
                }
            }
            found = next;
        }
        let mut out = Vec::new();
        for rel in found {
            if self.excluded_path(&rel) {
                continue;
            }
            let path = self.root.join(&rel);
            let meta = std::fs::symlink_metadata(&path).map_err(|e| BuildError::io(&path, e))?;
            out.push(Source { rel, path, meta });
        }
        Ok(out)
    }

    /// Whether `rel` or a directory above it is excluded (and not
    /// re-included).
    fn excluded_path(&self, rel: &str) -> bool {
        let is_dir = self.root.join(rel).is_dir();
        self.excluded(rel, is_dir)
    }

    /// Plans `COPY srcs... dest` from the context under Docker's rules.
    /// `dest_is_dir` tells whether `dest` exists as a directory in the
    /// image (it decides where a single file goes when `dest` has no
    /// trailing slash). `chmod` replaces every mode.
    pub fn plan_copy(
        &self,
        srcs: &[String],
        dest: &str,
        dest_is_dir: bool,
        chmod: Option<u32>,
    ) -> Result<CopyPlan> {
        let mut matched = Vec::new();
        for s in srcs {
            let found = self.sources(s)?;
            if found.is_empty() {
                return Err(BuildError::bad(
                    format!("source {s:?}"),
                    "not found in the build context (or excluded by .dockerignore)",
                    "check the path, relative to the context directory",
                ));
            }
            matched.extend(found);
        }
        let many = matched.len() > 1;
        let trailing = dest.ends_with('/');
        if many && !trailing && !dest_is_dir {
            return Err(BuildError::bad(
                format!("destination {dest:?}"),
                "several sources are copied, so it must be a directory",
                "end the destination with a slash",
            ));
        }
        let mut entries = Vec::new();
        let dest_clean = clean_abs(dest);
        let (dest_dir, single_name) = match &matched[..] {
            [one] if !one.meta.is_dir() && !trailing && !dest_is_dir => {
                let p = Path::new(&dest_clean);
                let name = p.file_name().map(PathBuf::from).ok_or_else(|| {
                    BuildError::bad(
                        format!("destination {dest:?}"),
                        "names no file",
                        "give a file name or a directory ending with a slash",
                    )
                })?;
                let parent = p
                    .parent()
                    .map_or("/".to_string(), |p| p.display().to_string());
                (parent, Some(name))
            }
            _ => (dest_clean.clone(), None),
        };
        for src in &matched {
            if src.meta.is_dir() {
                self.walk(&src.path, &src.rel, Path::new(""), chmod, &mut entries)?;
            } else {
                let name = single_name.clone().unwrap_or_else(|| {
                    PathBuf::from(src.path.file_name().unwrap_or(src.path.as_os_str()))
                });
                entries.push(entry(&src.path, name, &src.meta, chmod)?);
            }
        }
        Ok(CopyPlan { dest_dir, entries })
    }

    /// Adds the included entries below `dir` (context-relative `rel`) as
    /// `under/...`.
    fn walk(
        &self,
        dir: &Path,
        rel: &str,
        under: &Path,
        chmod: Option<u32>,
        out: &mut Vec<Entry>,
    ) -> Result<()> {
        let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(dir)
            .map_err(|e| BuildError::io(dir, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| BuildError::io(dir, e))?;
        names.sort();
        for n in names {
            let Some(ns) = n.to_str() else {
                return Err(BuildError::bad(
                    format!("{}", dir.join(&n).display()),
                    "the name is not UTF-8",
                    "rename it or exclude it in .dockerignore",
                ));
            };
            let child_rel = join_rel(rel, ns);
            let path = dir.join(&n);
            let meta = std::fs::symlink_metadata(&path).map_err(|e| BuildError::io(&path, e))?;
            let is_dir = meta.is_dir();
            let name = under.join(&n);
            if self.excluded(&child_rel, is_dir) {
                if is_dir && self.ignore.may_reinclude_below(&child_rel) {
                    // Only what an exception brings back is copied; its
                    // parent dirs come along.
                    let mut inner = Vec::new();
                    self.walk(&path, &child_rel, &name, chmod, &mut inner)?;
                    if !inner.is_empty() {
                        out.push(entry(&path, name, &meta, chmod)?);
                        out.extend(inner);
                    }
                }
                continue;
            }
            if is_special(meta.file_type()) {
                continue;
            }
            out.push(entry(&path, name.clone(), &meta, chmod)?);
            if is_dir {
                self.walk(&path, &child_rel, &name, chmod, out)?;
            }
        }
        Ok(())
    }
}

/// Sockets, fifos and devices are not copied (as Docker's context).
fn is_special(ft: std::fs::FileType) -> bool {
    use std::os::unix::fs::FileTypeExt;
    ft.is_socket() || ft.is_fifo() || ft.is_char_device() || ft.is_block_device()
}

fn entry(
    path: &Path,
    name: PathBuf,
    meta: &std::fs::Metadata,
    chmod: Option<u32>,
) -> Result<Entry> {
    let kind = if meta.is_dir() {
        Kind::Dir
    } else if meta.file_type().is_symlink() {
        Kind::Symlink(std::fs::read_link(path).map_err(|e| BuildError::io(path, e))?)
    } else {
        Kind::File { size: meta.len() }
    };
    let mode = match (&kind, chmod) {
        (Kind::Symlink(_), _) => 0o777,
        (_, Some(m)) => m,
        _ => meta.permissions().mode() & 0o7777,
    };
    Ok(Entry {
        name,
        src: path.to_path_buf(),
        kind,
        mode,
        mtime: u64::try_from(meta.mtime()).unwrap_or(0),
    })
}

impl CopyPlan {
    /// A hash of everything the copy writes: names, types, modes, bytes
    /// and link targets (not mtimes, as Docker's cache does not either).
    pub fn content_hash(&self) -> Result<String> {
        let mut h = Sha256::new();
        h.update(self.dest_dir.as_bytes());
        h.update([0]);
        for e in &self.entries {
            h.update(e.name.as_os_str().as_encoded_bytes());
            h.update([0]);
            h.update(e.mode.to_le_bytes());
            match &e.kind {
                Kind::Dir => h.update(b"d"),
                Kind::Symlink(t) => {
                    h.update(b"l");
                    h.update(t.as_os_str().as_encoded_bytes());
                }
                Kind::File { size } => {
                    h.update(b"f");
                    h.update(size.to_le_bytes());
                    let mut f =
                        std::fs::File::open(&e.src).map_err(|err| BuildError::io(&e.src, err))?;
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = f
                            .read(&mut buf)
                            .map_err(|err| BuildError::io(&e.src, err))?;
                        if n == 0 {
                            break;
                        }
                        h.update(&buf[..n]);
                    }
                }
            }
            h.update([0]);
        }
        Ok(hex::encode(h.finalize()))
    }

    /// Writes the entries as a tar stream of relative names.
    pub fn write_tar(&self, out: impl Write) -> std::io::Result<()> {
        let mut b = tar::Builder::new(out);
        for e in &self.entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(e.mode);
            h.set_mtime(e.mtime);
            h.set_uid(0);
            h.set_gid(0);
            match &e.kind {
                Kind::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, &e.name, std::io::empty())?;
                }
                Kind::Symlink(t) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, &e.name, t)?;
                }
                Kind::File { .. } => {
                    let f = std::fs::File::open(&e.src)?;
                    // The size read now: a file that changed since the plan
                    // is copied as it is now.
                    h.set_size(f.metadata()?.len());
                    h.set_entry_type(tar::EntryType::Regular);
                    b.append_data(&mut h, &e.name, f)?;
                }
            }
        }
        b.into_inner()?.flush()
    }
}

/// `p` made relative and clean: no leading `/`, no `.`, `..` never above
/// the root.
pub fn clean_rel(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(p).components() {
        match c {
            Component::Normal(n) => parts.push(n.to_str().unwrap_or_default()),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts.join("/")
}

/// `p` as a clean absolute path.
pub fn clean_abs(p: &str) -> String {
    format!("/{}", clean_rel(p))
}

fn join_rel(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_string()
    } else {
        format!("{base}/{name}")
    }
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}
